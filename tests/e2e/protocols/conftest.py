"""The proxy every SDK suite here runs against, once per engine protocol."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support import LiveProxy, live_proxy


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def proxy(
    request: pytest.FixtureRequest, module_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveProxy]:
    """The reference engine speaking vLLM's protocol, then SGLang's native one, scripted by the test module's
    ``TURNS`` (a list of turns, or a whole policy config): the same tests pass on both."""
    turns = request.module.TURNS
    config = turns if isinstance(turns, dict) else {"turns": turns}
    tmp = tmp_path_factory.mktemp(f"{request.module.__name__.rpartition('.')[2]}-{request.param}")
    with live_proxy(module_database_url, tmp, policy_config=json.dumps(config), engine_api=request.param) as live:
        yield live
