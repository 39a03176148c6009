"""``polar.refengine.vllm.launch``: real vLLM's command line and environment, on a CPU and on a GPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from polar.refengine.vllm.answers import LOG_ENV, POLICY_ENV
from polar.refengine.vllm.install import polar_import_dir
from polar.refengine.vllm.launch import FORCING, INSTANCE_MIDDLEWARE, VllmServer, server_command, server_env
from polar.refengine.vllm.model import MAX_MODEL_LEN

PYTHON, MODEL = Path("/venv/bin/python"), Path("/models/tiny")
BASE_OPTIONS: dict[str, str | None] = {
    "--model": str(MODEL),
    "--served-model-name": "polar-reference",
    "--host": "127.0.0.1",
    "--port": "8000",
    "--seed": "0",
    "--enable-auto-tool-choice": None,
    "--tool-call-parser": "hermes",
    "--reasoning-parser": "qwen3",
    "--middleware": INSTANCE_MIDDLEWARE,
    "--max-model-len": str(MAX_MODEL_LEN),
}
CPU_SETTINGS = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_ENABLE_V1_MULTIPROCESSING")


def _options(command: list[str]) -> dict[str, str | None]:
    """The flags after ``python -m vllm.entrypoints.openai.api_server``, each with its value (None: a switch)."""
    assert command[:3] == [str(PYTHON), "-m", "vllm.entrypoints.openai.api_server"]
    options: dict[str, str | None] = {}
    rest = command[3:]
    for index, word in enumerate(rest):
        if word.startswith("--"):
            following = rest[index + 1] if index + 1 < len(rest) else "--"
            assert word not in options, f"{word} given twice"
            options[word] = None if following.startswith("--") else following
    return options


def test_gpu_command_of_the_tiny_model() -> None:
    assert _options(server_command(VllmServer(), PYTHON, MODEL, on_cpu=False)) == BASE_OPTIONS


def test_cpu_command_adds_float32() -> None:
    options = _options(server_command(VllmServer(), PYTHON, MODEL, on_cpu=True))
    assert options == {**BASE_OPTIONS, "--dtype": "float32"}


def test_an_outside_model_gets_a_max_model_len_only_when_asked() -> None:
    outside = VllmServer(model=MODEL)
    assert "--max-model-len" not in _options(server_command(outside, PYTHON, MODEL, on_cpu=False))
    asked = VllmServer(model=MODEL, max_model_len=4096)
    assert _options(server_command(asked, PYTHON, MODEL, on_cpu=False))["--max-model-len"] == "4096"


@pytest.mark.parametrize(
    "server", [VllmServer(policy="tool_user"), VllmServer(log_path="/tmp/samples.jsonl")], ids=["policy", "log"]
)
def test_forcing_is_loaded_with_a_policy_or_a_sample_log(server: VllmServer) -> None:
    options = _options(server_command(server, PYTHON, MODEL, on_cpu=False))
    assert options == {**BASE_OPTIONS, "--logits-processors": FORCING}


def test_server_fields_and_extra_args_last() -> None:
    server = VllmServer(
        host="0.0.0.0", port=9001, served_model_name="policy-b", seed=7, extra_args=("--max-num-seqs", "4")
    )
    command = server_command(server, PYTHON, MODEL, on_cpu=False)
    assert command[-2:] == ["--max-num-seqs", "4"]
    assert _options(command) == {
        **BASE_OPTIONS,
        "--host": "0.0.0.0",
        "--port": "9001",
        "--served-model-name": "policy-b",
        "--seed": "7",
        "--max-num-seqs": "4",
    }


def test_gpu_env_has_dev_mode_and_no_cpu_settings(tmp_path: Path) -> None:
    base = {"HOME": "/home/u", "VLLM_SERVER_DEV_MODE": "0"}
    env = server_env(VllmServer(), on_cpu=False, base=base, cache=tmp_path)
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["HOME"] == "/home/u"
    assert not set(CPU_SETTINGS) & set(env)
    assert base == {"HOME": "/home/u", "VLLM_SERVER_DEV_MODE": "0"}  # the caller's mapping is left alone


def test_cpu_env_settings_never_override_the_callers(tmp_path: Path) -> None:
    env = server_env(VllmServer(), on_cpu=True, base={}, cache=tmp_path)
    assert tuple(env[name] for name in CPU_SETTINGS) == ("1", "nobind", "0")
    base = {"VLLM_CPU_KVCACHE_SPACE": "8", "VLLM_CPU_OMP_THREADS_BIND": "0-3", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    env = server_env(VllmServer(), on_cpu=True, base=base, cache=tmp_path)
    assert tuple(env[name] for name in CPU_SETTINGS) == ("8", "0-3", "1")


def test_pythonpath_starts_with_polar_and_keeps_the_callers(tmp_path: Path) -> None:
    polar_dir = str(polar_import_dir(tmp_path))
    alone = server_env(VllmServer(), on_cpu=False, base={}, cache=tmp_path)
    assert alone["PYTHONPATH"] == polar_dir
    kept = server_env(VllmServer(), on_cpu=False, base={"PYTHONPATH": f"/a{os.pathsep}/b"}, cache=tmp_path)
    assert kept["PYTHONPATH"].split(os.pathsep) == [polar_dir, "/a", "/b"]


def test_policy_and_log_are_set_when_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    server = VllmServer(
        policy="route", policy_config={"routes": [{"match": "", "policy": None}]},
        plugin_modules=("my_policies",), log_path="logs/samples.jsonl",
    )  # fmt: skip
    env = server_env(server, on_cpu=False, base={}, cache=tmp_path)
    assert json.loads(env[POLICY_ENV]) == {
        "name": "route",
        "config": {"routes": [{"match": "", "policy": None}]},
        "plugin_modules": ["my_policies"],
    }
    assert env[LOG_ENV] == str(
        (tmp_path / "logs" / "samples.jsonl").resolve()
    )  # absolute: vLLM's process has its own cwd


def test_policy_and_log_are_removed_when_not_given(tmp_path: Path) -> None:
    base = {POLICY_ENV: '{"name": "echo"}', LOG_ENV: "/tmp/old.jsonl"}
    env = server_env(VllmServer(), on_cpu=False, base=base, cache=tmp_path)
    assert POLICY_ENV not in env and LOG_ENV not in env
    only_log = server_env(VllmServer(log_path="/tmp/new.jsonl"), on_cpu=False, base=base, cache=tmp_path)
    assert POLICY_ENV not in only_log and only_log[LOG_ENV] == "/tmp/new.jsonl"
