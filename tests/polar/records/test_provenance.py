"""Batch provenance: what it records, that no secret reaches it, and that engines which are down or silent
neither fail nor stall a submission (a real reference engine, a closed port and a port that never answers)."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.codec.redaction import shown_url
from polar.config import Config, load_config
from polar.local.launcher import Stack, engine_spec, free_port
from polar.records.provenance import EngineProbe, config_digest, polar_version, public_config
from polar.storage.models import Batch
from tests.stage_calls import command_task, domain_services, submit_tasks

HANG_GUARD_S = 60  # a hang guard (a loaded machine's engine may take seconds to answer), not a speed claim
SECRETS = ("pg-pass-9d1f", "redis-pass-77ab", "engine-pass-c0de", "admin-token-5e5e", "read-token-4f4f")


def secret_env() -> dict[str, str]:
    return {
        "POLAR_DATABASE_URL": f"postgresql+psycopg://polar:{SECRETS[0]}@db.internal:5432/polar?password={SECRETS[0]}",
        "POLAR_BROKER_URL": f"redis://:{SECRETS[1]}@redis.internal:6379/0",
        "POLAR_ENGINE_URLS": f"http://user:{SECRETS[2]}@gpu1:8000,http://gpu2:8000",
        "POLAR_API_TOKEN": SECRETS[3],
        "POLAR_API_READ_TOKEN": SECRETS[4],
        "POLAR_SAMPLING_OVERRIDES": json.dumps({"temperature": 1.0, "api_key": SECRETS[3]}),
    }


def test_no_secret_reaches_the_recorded_configuration(tmp_path: Path) -> None:
    config = load_config(secret_env(), cwd=tmp_path)
    # Every field named like a credential, present now or added later, is left out whatever it holds.
    secret_fields = [f.name for f in dataclasses.fields(Config) if any(w in f.name for w in ("token", "password"))]
    assert "api_token" in secret_fields
    config = config.with_overrides(**{name: "field-secret-1a2b" for name in secret_fields})
    recorded = json.dumps(public_config(config))
    for secret in (*SECRETS, "field-secret-1a2b"):
        assert secret not in recorded
    public = public_config(config)
    assert public["database_url"] == "postgresql+psycopg://db.internal:5432/polar"
    assert public["broker_url"] == "redis://redis.internal:6379/0"
    assert public["engine_urls"] == ["http://gpu1:8000", "http://gpu2:8000"]
    assert public["sampling_overrides"] == {"temperature": 1.0}
    assert not set(secret_fields) & set(public)


def test_the_digest_follows_the_configuration_but_not_its_secrets(tmp_path: Path) -> None:
    config = load_config(secret_env(), cwd=tmp_path)
    assert config_digest(config).startswith("sha256:") and len(config_digest(config)) == 7 + 64
    assert config_digest(config.with_overrides(api_token="another")) == config_digest(config)
    assert config_digest(config.with_overrides(sampling_overrides={"temperature": 0.7})) != config_digest(config)
    assert shown_url("http://[::1]:8000/v1?key=x") == "http://[::1]:8000/v1"


@pytest.fixture
def engine_url(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    with Stack([engine_spec(port, "scripted")], {}, tmp_path / "logs"):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A port that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@contextmanager
def gated_engines(count: int) -> Iterator[list[str]]:
    """``count`` engines that answer nothing until all their asks (two paths each) are waiting, then answer them
    all: a probe that asked one after another would wait on its first ask until the hang guard, and get a 503."""
    expected, arrived, gate = 2 * count, [0], threading.Condition()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with gate:
                arrived[0] += 1
                gate.notify_all()
                all_in = gate.wait_for(lambda: arrived[0] >= expected, timeout=HANG_GUARD_S)
            answer = {"data": [{"id": "gated"}]} if self.path == "/v1/models" else {"version": "gated-1"}
            body = json.dumps(answer).encode()
            self.send_response(200 if all_in else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(count)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield [f"http://127.0.0.1:{server.server_address[1]}" for server in servers]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_engines_are_asked_once_and_down_ones_recorded(engine_url: str, silent_url: str) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    answering = EngineProbe(timeout_s=HANG_GUARD_S, ttl_s=60)
    live, down = answering.engines([engine_url, closed])
    assert live["models"] == ["polar-reference"] and live["version"] and live["error"] is None
    assert down["models"] is None and "ConnectError" in down["error"]
    # Cached per process: the same facts (``checked_at`` to the microsecond), not asked again.
    assert answering.engines([closed, engine_url]) == [down, live]

    # All asked at once: these engines answer only once all four asks are waiting together.
    with gated_engines(2) as gated:
        first, second = EngineProbe(timeout_s=HANG_GUARD_S, ttl_s=60).engines(gated)
    assert [(f["models"], f["version"], f["error"]) for f in (first, second)] == [(["gated"], "gated-1", None)] * 2

    # Each bounded: an engine that never answers is recorded as such once the probe's timeout has passed.
    probe = EngineProbe(timeout_s=0.5, ttl_s=60)
    with ThreadPoolExecutor(1) as pool:  # it returns although the engine never answers (60 s: a hang guard)
        (silent,) = pool.submit(probe.engines, [silent_url]).result(timeout=HANG_GUARD_S)
    assert silent["models"] is None and ("Timeout" in silent["error"] or "no answer" in silent["error"])
    assert probe.engines([silent_url]) == [silent]  # cached too: the same facts, not another wait


def test_submission_records_provenance(database_url: str, tmp_path: Path, engine_url: str, silent_url: str) -> None:
    env_secret = "admin-token-in-provenance-test"
    services = domain_services(
        database_url, tmp_path, engine_urls=(engine_url, silent_url), api_token=env_secret,
        sampling_overrides={"temperature": 1.0},
    )  # fmt: skip
    # The live engine's facts are asked first without a short bound (a loaded machine may take seconds to answer)
    # and kept per process, so the submission's short bound only decides about the silent engine.
    services.engine_probe.timeout_s = HANG_GUARD_S
    services.engine_probe.engines([engine_url])
    services.engine_probe.timeout_s = 0.5
    judge = {"name": "test_on_output", "config": {"command": "test -f done"}}
    with ThreadPoolExecutor(1) as pool:  # a silent engine does not stall a submission: it returns, bounded
        batch_id = pool.submit(
            submit_tasks,
            services,
            command_task("a", "touch done", evaluator=judge),
            command_task("b", "touch done", evaluator=judge),
            command_task("c", "true"),
        ).result(timeout=HANG_GUARD_S)
    with services.db.unit() as db:
        provenance = db.get(Batch, batch_id).provenance
        # In SQL, as docs/provenance.md shows.
        version = db.execute(
            sa.text("SELECT provenance ->> 'polar_version' FROM batches WHERE id = :id"), {"id": batch_id}
        ).scalar()
    services.db.dispose()
    assert version == polar_version() != "unknown"
    assert provenance["config_digest"] == config_digest(services.config)
    assert provenance["config"]["sampling_overrides"] == {"temperature": 1.0}
    assert env_secret not in json.dumps(provenance)
    assert [e["url"] for e in provenance["engines"]] == [engine_url, silent_url]
    assert provenance["engines"][0]["models"] == ["polar-reference"] and provenance["engines"][0]["version"]
    assert "Timeout" in provenance["engines"][1]["error"] or "no answer" in provenance["engines"][1]["error"]
    evaluators = {e["name"]: e for e in provenance["evaluators"]}
    assert evaluators["test_on_output"]["tasks"] == 2
    assert evaluators["session_completion"]["tasks"] == 1
    assert evaluators["test_on_output"]["code"] == f"polar {polar_version()}"
    assert len(evaluators["test_on_output"]["config_sha256"]) == 64


def test_the_api_shows_a_batchs_provenance(database_url: str, broker_url: str, tmp_path: Path, engine_url: str) -> None:
    from web.api import create_app

    token = "provenance-admin-token-" + "x" * 20
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_BROKER_URL": broker_url, "POLAR_READY_BUFFER": "0",
           "POLAR_ENGINE_URLS": engine_url, "POLAR_API_TOKEN": token}  # fmt: skip
    app = create_app(load_config(env, cwd=tmp_path))
    app.extensions["polar"].engine_probe.timeout_s = HANG_GUARD_S  # a loaded machine's engine may answer slowly
    client = app.test_client()
    headers = {"Authorization": f"Bearer {token}"}
    submitted = client.post("/v1/batches", json={"tasks": [command_task("a", "true")]}, headers=headers).json
    shown = client.get(f"/v1/batches/{submitted['batch_id']}", headers=headers).json
    app.extensions["polar"].db.dispose()
    provenance = shown["provenance"]
    assert provenance["polar_version"] == polar_version()
    assert provenance["engines"][0]["models"] == ["polar-reference"]
    assert provenance["config"]["engine_urls"] == [engine_url]
    assert token not in json.dumps(shown)
