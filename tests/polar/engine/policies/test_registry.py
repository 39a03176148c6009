from __future__ import annotations

import pytest

from polar.engine.policies import POLICIES, EchoPolicy, ScriptedPolicy, load_policy


def test_registry_names() -> None:
    assert {"scripted", "arithmetic", "echo"} <= set(POLICIES)
    assert isinstance(load_policy("scripted"), ScriptedPolicy)


def test_import_path() -> None:
    policy = load_policy("polar.engine.policies.echo:EchoPolicy", {"text": "x"})
    assert isinstance(policy, EchoPolicy)


@pytest.mark.parametrize("name", ["nope", "no.such.module:Thing", "polar.engine.policies.echo:Missing"])
def test_unknown_policies(name: str) -> None:
    with pytest.raises(ValueError):
        load_policy(name)
