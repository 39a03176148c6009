from __future__ import annotations

import json
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest

from polar.contract.task_request import HarnessSpec
from polar.errors import RuntimeFailure, ValidationError
from polar.harnesses.base import HarnessContext, HarnessLaunch
from polar.harnesses.install import (
    PACKAGES,
    binary_path,
    config_packages_dir,
    install,
    installed,
    installed_version,
    require_binary,
    runtime_bin_dirs,
)
from polar.harnesses.registry import HARNESSES
from tests.outside import Outside, refusal

PRESETS = ("claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi", "mini_swe_agent", "hermes", "openclaw",
           "kilocode", "cline", "mistral_vibe", "droid", "kimi_cli", "aider")  # fmt: skip
KEY = "pk-test"
PROXY = "http://127.0.0.1:9"
BASE = f"{PROXY}/s/{KEY}"


def stand_in(cache: Path, name: str, version: str) -> None:
    """What an install of preset ``name`` leaves in ``cache``: its binary, its package's metadata (package.json,
    or a dist-info in its own virtualenv) and the Node.js it needs, if any."""
    package = PACKAGES[name]
    binary = binary_path(name, cache)
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\n")
    if package.source == "pypi":
        site = cache / "venvs" / name / "lib" / "python3.11" / "site-packages"
        if package.python is not None:  # made on the interpreter the preset pins
            (binary.parent.parent / "pyvenv.cfg").write_text(f"home = /py/bin\nversion = {package.python}.4\n")
        dist = site / f"{package.package.replace('-', '_')}-{version}.dist-info"  # as pip names it
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package.package}\nVersion: {version}\n")
    else:
        manifest = cache / "node_modules" / package.package / "package.json"
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"name": package.package, "version": version}))
    for bin_dir in runtime_bin_dirs(name, cache):
        bin_dir.mkdir(parents=True, exist_ok=True)
        (bin_dir / "node").write_text("#!/bin/sh\n")
    if package.config_packages:  # npm install --save-exact --prefix <cache>/config/<preset> …
        where = config_packages_dir(name, cache)
        (where / "node_modules" / "@opencode-ai" / "plugin").mkdir(parents=True, exist_ok=True)
        (where / "package.json").write_text('{"dependencies": {"@opencode-ai/plugin": "1.18.33"}}')
        (where / "package-lock.json").write_text('{"lockfileVersion": 3}')


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A harness cache holding a stand-in install of every preset (at its pinned version, else 1.2.3)."""
    cache = tmp_path / "cache"
    for name, package in PACKAGES.items():
        stand_in(cache, name, package.version or "1.2.3")
    monkeypatch.setenv("POLAR_HARNESS_CACHE", str(cache))
    return cache


def launch(tmp_path: Path, name: str, **spec: Any) -> tuple[HarnessLaunch, Path]:
    session_dir = tmp_path / "session"
    (session_dir / "home").mkdir(parents=True, exist_ok=True)
    context = HarnessContext(
        session_id=uuid.uuid4(),
        task_id="t",
        instruction="Create hello.txt containing HI",
        spec=HarnessSpec(name=name, **spec),
        proxy_url=PROXY,
        proxy_key=KEY,
        session_dir=session_dir,
        runtime_env={"FROM_RUNTIME": "1"},
    )
    return HARNESSES[name].launch(context), session_dir / "home"


@pytest.mark.parametrize("name", PRESETS)
def test_registered_with_private_home_and_proxy_env(name: str, cache: Path, tmp_path: Path) -> None:
    assert HARNESSES[name].name == name
    result, home = launch(tmp_path, name, env={"EXTRA": "x"})
    assert result.command[0] == str(binary_path(name, cache))
    assert result.env["HOME"] == str(home)
    assert result.env["OPENAI_BASE_URL"] == f"{BASE}/v1" and result.env["ANTHROPIC_BASE_URL"] == BASE
    assert result.env["EXTRA"] == "x" and result.env["FROM_RUNTIME"] == "1"
    assert "Create hello.txt containing HI" in " ".join(result.command)


@pytest.mark.parametrize("name", PRESETS)
def test_missing_cli_is_a_runtime_failure(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLAR_HARNESS_CACHE", str(tmp_path / "empty"))
    with pytest.raises(RuntimeFailure, match=f"not installed.*polar harness install {name}"):
        launch(tmp_path, name)


def test_claude_code(cache: Path, tmp_path: Path) -> None:
    servers = {"fs": {"command": "mcp-fs", "args": ["/"]}}
    result, home = launch(
        tmp_path, "claude_code", model="m1", settings={"max_turns": 3, "extra_args": ["--x"], "mcp_servers": servers}
    )
    mcp = home / ".claude" / "mcp.json"
    assert result.command[1:] == [
        "--verbose", "--output-format=stream-json", "--dangerously-skip-permissions", "--model", "m1",
        "--max-turns", "3", "--mcp-config", str(mcp), "--x", "-p", "Create hello.txt containing HI",
    ]  # fmt: skip
    assert json.loads(mcp.read_text()) == {"mcpServers": servers}
    env = result.env
    assert env["CLAUDE_CONFIG_DIR"] == str(home / ".claude") and env["IS_SANDBOX"] == "1"
    assert env["ANTHROPIC_API_KEY"] == KEY and env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert {env[f"ANTHROPIC_DEFAULT_{tier}_MODEL"] for tier in ("SONNET", "OPUS", "HAIKU")} == {"m1"}
    assert env["ANTHROPIC_MODEL"] == env["CLAUDE_CODE_SUBAGENT_MODEL"] == "m1"


def test_codex(cache: Path, tmp_path: Path) -> None:
    servers = {"docs": {"command": "npx", "args": ["-y", "docs-mcp"], "env": {"A": "b"}}}
    result, home = launch(tmp_path, "codex", settings={"mcp_servers": servers, "extra_args": ["-c", "a=1"]})
    assert result.command[1:] == [
        "exec", "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check", "--json",
        "--model", "polar-policy", "-c", "a=1", "--", "Create hello.txt containing HI",
    ]  # fmt: skip
    config = tomllib.loads((home / ".codex" / "config.toml").read_text())
    assert config["model"] == "polar-policy" and config["model_provider"] == "polar"
    assert config["model_providers"]["polar"] == {
        "name": "polar", "base_url": f"{BASE}/v1", "env_key": "POLAR_PROXY_KEY", "wire_api": "responses",
    }  # fmt: skip
    assert config["mcp_servers"] == servers
    assert json.loads((home / ".codex" / "auth.json").read_text()) == {"OPENAI_API_KEY": KEY}
    assert result.env["CODEX_HOME"] == str(home / ".codex") and result.env["POLAR_PROXY_KEY"] == KEY


def test_gemini_cli(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "gemini_cli", model="g", settings={"max_turns": 5, "mcp_servers": {"s": {}}})
    assert result.command[1:] == ["--approval-mode=yolo", "--model=g", "--prompt=Create hello.txt containing HI"]
    settings = json.loads((home / ".gemini" / "settings.json").read_text())
    assert settings["security"] == {"auth": {"selectedType": "gemini-api-key"}}
    assert settings["model"] == {"maxSessionTurns": 5} and settings["mcpServers"] == {"s": {}}
    assert result.env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"
    assert result.env["GOOGLE_GEMINI_BASE_URL"] == BASE and result.env["GEMINI_API_KEY"] == KEY


def test_qwen_code(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "qwen_code", model="q", settings={"extra_args": ["--debug"]})
    assert result.command[1:] == ["--yolo", "--debug", "--prompt=Create hello.txt containing HI"]
    settings = json.loads((home / ".qwen" / "settings.json").read_text())
    assert settings["security"] == {"auth": {"selectedType": "openai"}} and "model" not in settings
    assert result.env["OPENAI_MODEL"] == "q" and result.env["OPENAI_API_KEY"] == KEY


def test_opencode(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "opencode", model="o", settings={"mcp_servers": {"s": {"type": "local"}}})
    assert result.command[1:] == ["-m", "polar/o", "run", "--format=json", "--", "Create hello.txt containing HI"]
    config = json.loads((home / ".config" / "opencode" / "opencode.json").read_text())
    provider = config["provider"]["polar"]
    assert provider["options"] == {"baseURL": f"{BASE}/v1", "apiKey": KEY} and provider["models"] == {
        "o": {"name": "o"}
    }
    assert set(config["permission"].values()) == {"allow"} and config["mcp"] == {"s": {"type": "local"}}
    assert result.env["OPENCODE_FAKE_VCS"] == "git" and result.env["XDG_CONFIG_HOME"] == str(home / ".config")
    # its plugin SDK as npm installed it in the cache: nothing for opencode to fetch at start
    config_dir, cached = home / ".config" / "opencode", config_packages_dir("opencode", cache)
    assert (config_dir / "node_modules").resolve() == (cached / "node_modules").resolve()
    for name in ("package.json", "package-lock.json"):
        assert (config_dir / name).read_text() == (cached / name).read_text()


def test_opencode_without_its_config_packages_is_not_installed(cache: Path) -> None:
    assert installed_version("opencode", cache) == PACKAGES["opencode"].version
    (config_packages_dir("opencode", cache) / "package-lock.json").unlink()  # an install from before they were cached
    assert installed_version("opencode", cache) is None


def test_pi(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "pi")
    assert result.command[1:] == [
        "--print", "--mode", "json", "--no-session", "--provider", "polar", "--model", "polar-policy",
        "Create hello.txt containing HI",
    ]  # fmt: skip
    models = json.loads((home / ".pi" / "agent" / "models.json").read_text())
    provider = models["providers"]["polar"]
    assert provider["baseUrl"] == f"{BASE}/v1" and provider["apiKey"] == KEY
    assert provider["compat"]["maxTokensField"] == "max_tokens"
    assert provider["models"][0]["id"] == "polar-policy" and provider["models"][0]["api"] == "openai-completions"
    assert result.env["PI_OFFLINE"] == "1"


@pytest.mark.parametrize(
    ("name", "settings", "message"),
    [
        ("codex", {"max_turns": 2}, "does not support"),
        ("pi", {"mcp_servers": {"a": {}}}, "does not support"),
        ("opencode", {"max_turns": 2}, "does not support"),
        ("claude_code", {"max_turn": 2}, "unknown settings"),
        ("gemini_cli", {"max_turns": 0}, "positive integer"),
        ("qwen_code", {"extra_args": "--x"}, "list of strings"),
    ],
)
def test_bad_settings(name: str, settings: dict, message: str, cache: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailure, match=message):
        launch(tmp_path, name, settings=settings)


def test_mini_swe_agent_runs_text_based_from_its_own_virtualenv(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "mini_swe_agent", model="m1", settings={"max_turns": 7, "extra_args": ["--x"]})
    assert result.command[0] == str(cache / "venvs" / "mini_swe_agent" / "bin" / "mini-swe-agent")
    assert result.command[1:] == [
        "--yolo", "--exit-immediately", "--cost-limit", "0", "-c", "mini_textbased.yaml",
        "--model-class", "litellm_textbased", "-c", "agent.step_limit=7", "--model", "openai/m1",
        "--output", str(home / "trajectory.json"), "--x", "--task", "Create hello.txt containing HI",
    ]  # fmt: skip
    assert result.env["OPENAI_API_BASE"] == f"{BASE}/v1" and result.env["OPENAI_API_KEY"] == KEY
    assert result.env["MSWEA_GLOBAL_CONFIG_DIR"] == str(home / ".config" / "mini-swe-agent")
    with pytest.raises(RuntimeFailure, match="does not support"):
        launch(tmp_path, "mini_swe_agent", settings={"mcp_servers": MCP})


def test_openclaw_runs_on_the_caches_node_with_only_the_proxy_configured(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "openclaw", model="m1", settings={"mcp_servers": MCP, "extra_args": ["--x"]})
    config = home / ".openclaw" / "openclaw.json"
    assert result.command[1:] == ["agent", "exec", "--json", "--config", str(config), "--model", "polar/m1",
                                  "--timeout", "0", "--x", "--", "Create hello.txt containing HI"]  # fmt: skip
    assert result.env["PATH"].split(":")[0] == str(runtime_bin_dirs("openclaw", cache)[0])
    written = json.loads(config.read_text())
    assert written["models"]["providers"]["polar"]["baseUrl"] == f"{BASE}/v1"
    assert written["memory"]["search"]["enabled"] is False and written["mcp"] == {"servers": MCP}
    with pytest.raises(RuntimeFailure, match="does not support"):
        launch(tmp_path, "openclaw", settings={"max_turns": 3})


def test_hermes_gets_a_home_with_only_the_proxy_and_no_side_traffic(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "hermes", model="m1", settings={"max_turns": 4, "extra_args": ["--x"]})
    assert result.command[1:] == ["--yolo", "chat", "--quiet", "--provider", "polar", "--model", "m1",
                                  "--max-turns", "4", "--x", "--query=Create hello.txt containing HI"]  # fmt: skip
    assert result.env["HERMES_HOME"] == str(home / ".hermes")
    config = json.loads((home / ".hermes" / "config.yaml").read_text())
    assert config["providers"]["polar"] == {"base_url": f"{BASE}/v1", "key_env": "OPENAI_API_KEY",
                                            "api_mode": "chat_completions"}  # fmt: skip
    assert config["memory"]["memory_enabled"] is False and config["security"]["allow_lazy_installs"] is False
    update_check = json.loads((home / ".hermes" / ".update_check").read_text())
    assert update_check["ver"] == PACKAGES["hermes"].version  # seeded fresh: no question to PyPI
    with pytest.raises(RuntimeFailure, match=r"hermes-agent\[mcp\]"):  # the stand-in install has no mcp package
        launch(tmp_path, "hermes", settings={"mcp_servers": MCP})


def test_kilocode_is_opencode_with_kilos_own_switches_off(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "kilocode", model="k", settings={"extra_args": ["--x"]})
    assert result.command[1:] == ["run", "--auto", "--format", "json", "-m", "polar/k", "--x", "--",
                                  "Create hello.txt containing HI"]  # fmt: skip
    config = json.loads((home / ".config" / "kilo" / "kilo.json").read_text())
    assert config["provider"]["polar"]["options"] == {"baseURL": f"{BASE}/v1", "apiKey": KEY}
    assert config["enabled_providers"] == ["polar"] and set(config["permission"].values()) == {"allow"}
    assert result.env["KILO_DISABLE_MODELS_FETCH"] == "1" and result.env["KILO_DISABLE_AUTOUPDATE"] == "1"
    with pytest.raises(RuntimeFailure, match="does not support"):
        launch(tmp_path, "kilocode", settings={"max_turns": 3})


def test_cline_gets_an_openai_compatible_provider_and_node_24(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "cline", model="c")
    assert result.command[1:] == ["--json", "--config", str(home / ".cline"), "--auto-approve", "true", "-P",
                                  "openai-compatible", "-m", "c", "--", "Create hello.txt containing HI"]  # fmt: skip
    providers = json.loads((home / ".cline" / "data" / "settings" / "providers.json").read_text())
    assert providers["providers"]["openai-compatible"]["updatedAt"].endswith("Z")
    assert providers["providers"]["openai-compatible"]["settings"] == {
        "provider": "openai-compatible", "apiKey": KEY, "model": "c", "baseUrl": f"{BASE}/v1",
    }  # fmt: skip
    assert result.env["PATH"].split(":")[0] == str(runtime_bin_dirs("cline", cache)[0])


def test_mistral_vibe_runs_programmatically_on_one_generic_provider(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "mistral_vibe", model="v", settings={"max_turns": 5})
    assert result.command[0] == str(cache / "venvs" / "mistral_vibe" / "bin" / "vibe")
    assert result.command[1:] == ["--trust", "--output", "json", "--max-turns", "5",
                                  "--prompt=Create hello.txt containing HI"]  # fmt: skip
    config = tomllib.loads((home / ".vibe" / "config.toml").read_text())
    assert config["providers"] == [{"name": "polar", "api_base": f"{BASE}/v1", "api_key_env_var": "OPENAI_API_KEY",
                                    "backend": "generic"}]  # fmt: skip
    assert config["models"] == [{"name": "v", "provider": "polar", "alias": "v"}] and config["active_model"] == "v"
    assert config["enable_telemetry"] is False and config["enable_update_checks"] is False
    assert result.env["VIBE_HOME"] == str(home / ".vibe")


def test_droid_uses_a_custom_model_without_an_account(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "droid", model="d")
    assert result.command[1:] == ["exec", "--skip-permissions-unsafe", "--output-format", "json", "-m",
                                  "custom:polar-0", "--", "Create hello.txt containing HI"]  # fmt: skip
    [model] = json.loads((home / ".factory" / "settings.json").read_text())["customModels"]
    assert (model["model"], model["baseUrl"], model["apiKey"]) == ("d", f"{BASE}/v1", KEY)
    assert model["provider"] == "generic-chat-completion-api"


def test_kimi_cli_prints_from_one_openai_provider(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "kimi_cli", model="k2", settings={"max_turns": 6, "mcp_servers": MCP},
                          env={"KIMI_MODEL_NAME": "mine"})  # fmt: skip
    config_file = home / ".kimi" / "config.json"
    assert result.command[0] == str(cache / "venvs" / "kimi_cli" / "bin" / "kimi")
    mcp = json.dumps({"mcpServers": MCP})
    assert result.command[1:] == ["--print", "--output-format", "stream-json", "--yolo", "--config-file",
                                  str(config_file), "-m", "polar", "--max-steps-per-turn", "6", "--mcp-config",
                                  mcp, "--prompt=Create hello.txt containing HI"]  # fmt: skip
    config = json.loads(config_file.read_text())
    assert config["providers"]["polar"] == {"type": "openai_legacy", "base_url": f"{BASE}/v1", "api_key": KEY}
    assert config["models"]["polar"]["model"] == "k2" and config["telemetry"] is False
    assert result.env["KIMI_SHARE_DIR"] == str(home / ".kimi") and result.env["KIMI_DISABLE_TELEMETRY"] == "1"
    assert result.env["KIMI_MODEL_NAME"] == "mine"  # a task's own env still wins


def test_aider_lists_whole_files_through_litellm(cache: Path, tmp_path: Path) -> None:
    result, home = launch(tmp_path, "aider", model="a")
    assert result.command[0] == str(cache / "venvs" / "aider" / "bin" / "aider")
    assert result.command[1:6] == ["--message=Create hello.txt containing HI", "--yes-always", "--edit-format",
                                   "whole", "--model"]  # fmt: skip
    assert result.command[6:9] == ["openai/a", "--openai-api-base", f"{BASE}/v1"]
    assert "--no-git" in result.command and "--analytics-disable" in result.command
    assert str(home / ".aider" / "chat.history.md") in result.command
    assert result.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and result.env["OPENAI_API_KEY"] == KEY
    with pytest.raises(RuntimeFailure, match="does not support"):
        launch(tmp_path, "aider", settings={"max_turns": 2})


def test_a_pinned_preset_at_another_version_is_not_installed(tmp_path: Path) -> None:
    """``pip install hermes-agent`` by hand, or an older pin: the preset's own version is installed over it."""
    cache = tmp_path / "cache"
    stand_in(cache, "hermes", "0.18.0")
    assert installed_version("hermes", cache) is None
    with pytest.raises(RuntimeFailure, match=r"hermes-agent\[mcp\]==0\.19\.0 CLI is not installed"):
        require_binary("hermes", cache)
    stand_in(cache, "openclaw", "2026.9.6")
    assert installed_version("openclaw", cache) == "2026.9.6"
    (runtime_bin_dirs("openclaw", cache)[0] / "node").unlink()  # the Node.js 24 it runs on went missing
    assert installed_version("openclaw", cache) is None
    assert runtime_bin_dirs("pi", cache) == []


def test_a_venv_on_another_python_than_the_pinned_one_is_not_installed(cache: Path) -> None:
    assert installed_version("kimi_cli", cache) == PACKAGES["kimi_cli"].version
    config = cache / "venvs" / "kimi_cli" / "pyvenv.cfg"
    config.write_text("home = /py/bin\nversion = 3.12.1\n")  # kimi-cli 1.51 fails on 3.12.1's typing
    assert installed_version("kimi_cli", cache) is None


def test_install_skips_what_is_cached(cache: Path) -> None:
    pinned = {name: PACKAGES[name].version for name in ("pi", "codex")}
    assert install(["pi", "codex", "pi"], cache) == pinned  # no npm call needed
    assert installed(cache) == {name: package.version or "1.2.3" for name, package in PACKAGES.items()}
    assert installed_version("pi", cache.parent / "none") is None
    with pytest.raises(ValidationError, match="unknown harness preset"):
        install(["vim"], cache)


# Where each preset writes its config under the session's home (claude_code writes only with MCP servers).
CONFIG_FILES = {
    "claude_code": ".claude/mcp.json",
    "codex": ".codex/auth.json",
    "gemini_cli": ".gemini/settings.json",
    "qwen_code": ".qwen/settings.json",
    "opencode": ".config/opencode/opencode.json",
    "pi": ".pi/agent/models.json",
    "openclaw": ".openclaw/openclaw.json",
    "hermes": ".hermes/config.yaml",
    "kilocode": ".config/kilo/kilo.json",
    "cline": ".cline/data/settings/providers.json",
    "mistral_vibe": ".vibe/config.toml",
    "droid": ".factory/settings.json",
    "kimi_cli": ".kimi/config.json",
}
# Where each preset keeps its state: the directory the link tests point elsewhere (mini-swe-agent writes no
# config of Polar's, but its global config folder is made there).
CONFIG_DIRS = {**{name: path.split("/")[0] for name, path in CONFIG_FILES.items()}, "mini_swe_agent": ".config",
               "aider": ".aider"}  # fmt: skip
MCP = {"fs": {"command": "mcp-fs", "args": ["/"]}}


def _launch_refused(tmp_path: Path, name: str) -> str | None:
    settings = {"mcp_servers": MCP} if name == "claude_code" else {}
    return refusal(lambda: launch(tmp_path, name, settings=settings))


@pytest.mark.parametrize("name", CONFIG_DIRS)
def test_a_linked_config_directory_is_not_written_through(name: str, cache: Path, tmp_path: Path) -> None:
    """A prepare step linked the CLI's config directory to a host directory: the host, often root, would write the
    config (with the session's proxy key) there and chmod it."""
    outside = Outside.make(tmp_path)
    home = tmp_path / "session" / "home"
    home.mkdir(parents=True)
    top = CONFIG_DIRS[name]
    (home / top).symlink_to(outside.root, target_is_directory=True)
    refused = _launch_refused(tmp_path, name)
    outside.assert_unchanged()
    assert refused is not None and f"home/{top}" in refused


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_a_linked_config_file_is_not_written_through(name: str, cache: Path, tmp_path: Path) -> None:
    outside = Outside.make(tmp_path)
    config = tmp_path / "session" / "home" / CONFIG_FILES[name]
    config.parent.mkdir(parents=True)
    config.symlink_to(outside.victim)
    refused = _launch_refused(tmp_path, name)
    outside.assert_unchanged()
    assert refused is not None and CONFIG_FILES[name] in refused


def test_a_linked_home_is_not_written_through(cache: Path, tmp_path: Path) -> None:
    outside = Outside.make(tmp_path)
    (tmp_path / "session").mkdir()
    (tmp_path / "session" / "home").symlink_to(outside.root, target_is_directory=True)
    refused = _launch_refused(tmp_path, "codex")
    outside.assert_unchanged()
    assert refused is not None and "home" in refused


def test_settings_config_is_merged_into_the_config_file_each_preset_writes(cache: Path, tmp_path: Path) -> None:
    _, home = launch(tmp_path / "g", "gemini_cli", settings={"max_turns": 5, "config": {
        "model": {"compressionThreshold": 0.3}, "general": {"vimMode": True}}})  # fmt: skip
    settings = json.loads((home / ".gemini" / "settings.json").read_text())
    assert settings["model"] == {"maxSessionTurns": 5, "compressionThreshold": 0.3}  # merged key by key
    assert settings["general"] == {"disableAutoUpdate": True, "disableUpdateNag": True, "vimMode": True}
    _, home = launch(tmp_path / "q", "qwen_code", settings={"config": {"model": {"generationConfig": {"a": 1}}}})
    assert json.loads((home / ".qwen" / "settings.json").read_text())["model"] == {"generationConfig": {"a": 1}}
    limit = {"limit": {"context": 16000, "output": 2000}}
    _, home = launch(tmp_path / "o", "opencode", settings={"config": {"provider": {"polar": {"models": {
        "polar-policy": limit}}}}})  # fmt: skip
    opencode = json.loads((home / ".config" / "opencode" / "opencode.json").read_text())
    assert opencode["provider"]["polar"]["models"]["polar-policy"] == {"name": "polar-policy", **limit}
    assert opencode["provider"]["polar"]["npm"] == "@ai-sdk/openai-compatible"  # the rest kept
    _, home = launch(tmp_path / "c", "codex", settings={"config": {"model_auto_compact_token_limit": 15500}})
    config = tomllib.loads((home / ".codex" / "config.toml").read_text())
    assert config["model_auto_compact_token_limit"] == 15500 and config["model_providers"]["polar"]["name"] == "polar"
    with pytest.raises(RuntimeFailure, match=r"writes no config file to merge settings\.config into"):
        launch(tmp_path / "cc", "claude_code", settings={"config": {"a": 1}})
    with pytest.raises(RuntimeFailure, match=r"settings\.config must be an object"):
        launch(tmp_path / "bad", "gemini_cli", settings={"config": [1]})
