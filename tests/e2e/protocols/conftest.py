"""The proxy every SDK suite here runs against, once per engine protocol."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.live_proxy import LiveProxy, live_proxy, real_vllm_proxy
from tests.real_vllm import SCRIPTED


@pytest.fixture(scope="module", params=["real-vllm", "sglang"])
def proxy(
    request: pytest.FixtureRequest, module_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveProxy]:
    """Real vLLM (the run's shared server, on this module's route), then the reference engine speaking SGLang's
    native protocol (no SGLang runs here), scripted by the test module's ``TURNS`` (a list of turns, or a whole
    policy config): the same tests pass on both. The reference engine's own vLLM protocol is tested against vLLM's
    recorded schemas (tests/polar/proxy/test_engine_contracts.py) and in tests/polar/refengine."""
    tmp = tmp_path_factory.mktemp(f"{request.module.__name__.rpartition('.')[2]}-{request.param}")
    if request.param == "real-vllm":
        (route,) = [name for name, (module, _) in SCRIPTED.items() if module == request.module.__name__]
        with real_vllm_proxy(module_database_url, tmp, request.getfixturevalue("real_vllm"), route) as live:
            yield live
        return
    turns = request.module.TURNS
    config = turns if isinstance(turns, dict) else {"turns": turns}
    with live_proxy(module_database_url, tmp, policy_config=json.dumps(config), engine_api=request.param) as live:
        yield live
