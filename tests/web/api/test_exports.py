"""``GET /v1/batches/<id>/export`` and ``polar export``: every kind and format loads with ``datasets`` as is."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from flask.testing import FlaskClient

from polar.config import load_config
from polar.local.cli import main
from polar.local.launcher import Stack, free_port, gunicorn_spec
from tests.polar.training.test_exports import RL_COLUMNS, BatchFactory
from web.api import create_app

SFT_COLUMNS = ["session_id", "task_id", "sample_index", "reward", "messages", "tools", "images"]
TOKEN = "test-admin-token-" + "0" * 24


@pytest.fixture
def client(database_url: str, tmp_path: Path) -> Iterator[FlaskClient]:
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_BROKER_URL": "memory://", "POLAR_READY_BUFFER": "0",
           "POLAR_API_TOKEN": TOKEN}  # fmt: skip
    app = create_app(load_config(env, cwd=tmp_path))
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    yield client
    app.extensions["polar"].db.dispose()


@pytest.fixture
def batch(client: FlaskClient) -> BatchFactory:
    """Two tasks: a has samples rewarded 1.0 and 0.0, b one sample with no reward (3 completed sessions)."""
    factory = BatchFactory(client.application.extensions["polar"])
    first, second = factory.task("a", {"policy_version": "v1"}), factory.task("b")
    factory.session(first, 0, reward=1.0)
    factory.session(first, 1, reward=0.0)
    factory.session(second, 0, reward=None, calls=1)
    return factory


def load(path: Path, fmt: str, cache: Path) -> Any:
    """The file through ``datasets`` with no mapping code, offline (see ``_offline``) into a private cache."""
    import datasets

    builder = "json" if fmt == "jsonl" else "parquet"
    return datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=str(cache / "hf-cache"))


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_rl_export_loads_with_datasets(client: FlaskClient, batch: BatchFactory, tmp_path: Path, fmt: str) -> None:
    response = client.get(f"/v1/batches/{batch.batch_id}/export?kind=rl&format={fmt}")
    assert response.status_code == 200, response.data
    assert response.headers["Content-Disposition"] == f"attachment; filename={batch.batch_id}-rl.{fmt}"
    assert response.mimetype == {"jsonl": "application/x-ndjson", "parquet": "application/vnd.apache.parquet"}[fmt]
    assert (response.headers["X-Polar-Sessions"], response.headers["X-Polar-Accepted"]) == ("3", "3")
    assert response.headers["X-Polar-Acceptance-Rate"] == "1" and response.headers["X-Polar-Rows"] == "5"
    path = tmp_path / f"rl.{fmt}"
    path.write_bytes(response.data)

    dataset = load(path, fmt, tmp_path)
    assert dataset.column_names == RL_COLUMNS and dataset.num_rows == 5
    assert dataset[0]["token_ids"] == [1, 2, 3, 101, 102] and dataset[0]["loss_mask"] == [0, 0, 0, 1, 1]
    assert dataset[0]["logprobs"] == [0.0, 0.0, 0.0, -0.5, -0.25]
    assert dataset["reward"] == [1.0, 1.0, 0.0, 0.0, None]
    assert dataset["policy_version"] == ["v1"] * 4 + [None]
    assert dataset["group_id"] == [f"{batch.batch_id}:0"] * 4 + [f"{batch.batch_id}:1"]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_sft_export_loads_with_datasets(client: FlaskClient, batch: BatchFactory, tmp_path: Path, fmt: str) -> None:
    response = client.get(f"/v1/batches/{batch.batch_id}/export?kind=sft&format={fmt}&min_reward=0.5")
    assert response.status_code == 200, response.data
    assert (response.headers["X-Polar-Sessions"], response.headers["X-Polar-Accepted"]) == ("3", "1")
    assert response.headers["X-Polar-Acceptance-Rate"] == "0.333333"
    path = tmp_path / f"sft.{fmt}"
    path.write_bytes(response.data)

    dataset = load(path, fmt, tmp_path)
    assert dataset.column_names == SFT_COLUMNS and dataset.num_rows == 1
    messages = dataset[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == '{"x": "2+2"}'
    assert messages[-1]["content"] == "answer 2" and dataset[0]["reward"] == 1.0
    assert '"name": "calc"' in dataset[0]["tools"][0]

    everything = client.get(f"/v1/batches/{batch.batch_id}/export?kind=sft&format={fmt}")
    assert everything.headers["X-Polar-Accepted"] == "3" and everything.headers["X-Polar-Rows"] == "3"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("kind=dpo", "kind"),
        ("format=csv", "format"),
        ("min_reward=high", "min_reward"),
        ("min_reward=nan", "min_reward"),
    ],
)
def test_bad_parameters_are_400(client: FlaskClient, batch: BatchFactory, query: str, field: str) -> None:
    response = client.get(f"/v1/batches/{batch.batch_id}/export?{query}")
    assert response.status_code == 400 and response.json["error"]["field"] == field
    assert field in response.json["error"]["message"]


@pytest.mark.parametrize("batch_id", ["00000000-0000-0000-0000-000000000000", "nope"])
def test_unknown_batch_is_404(client: FlaskClient, batch_id: str) -> None:
    for fmt in ("jsonl", "parquet"):
        response = client.get(f"/v1/batches/{batch_id}/export?kind=rl&format={fmt}")
        assert response.status_code == 404 and "not found" in response.json["error"]["message"]


def test_cli_export_through_gunicorn(database_url: str, batch: BatchFactory, tmp_path: Path) -> None:
    port = free_port()
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_BROKER_URL": "memory://", "POLAR_API_TOKEN": TOKEN}
    api = gunicorn_spec("api", "web.api:create_app()", port, workers=1, threads=4)
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "out.parquet"
    with Stack([api], env, tmp_path / "logs"):
        args = ["export", str(batch.batch_id), "--kind", "rl", "--format", "parquet", "--api", url, "--token", TOKEN]
        result = CliRunner().invoke(main, [*args, "--out", str(out), "--min-reward", "0.5"])
        assert result.exit_code == 0, result.output
        assert "3 sessions, 1 accepted (acceptance rate 33.3%), 2 rows, 10 tokens" in result.output
        missing = CliRunner().invoke(main, ["export", "00000000-0000-0000-0000-000000000000", "--api", url,
                                            "--token", TOKEN, "--out", str(tmp_path / "x.jsonl")])  # fmt: skip
        assert missing.exit_code != 0 and "404" in missing.output
    dataset = load(out, "parquet", tmp_path)
    assert dataset.num_rows == 2 and dataset["reward"] == [1.0, 1.0]
