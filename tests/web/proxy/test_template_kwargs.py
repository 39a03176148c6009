"""``chat_template_kwargs`` reach the engine's chat template only for the keys the operator allows
(``POLAR_CHAT_TEMPLATE_KWARGS``): a client's own template (vLLM GHSA-6fvq-23cw-5628) or any other key is refused
with the protocol's 400 and never sent to the engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live_proxy import LiveProxy, live_proxy
from tests.processes import HANG_GUARD_S


def _ask(url: str, **extra: object) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=HANG_GUARD_S)


@pytest.fixture(scope="module")
def proxy(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProxy]:
    """The default allow-list, one proxy for the module (each case gets its own session and reads only its calls)."""
    with live_proxy(module_database_url, tmp_path_factory.mktemp("template-kwargs")) as live:
        yield live


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"chat_template": "{{ cycler.__init__.__globals__ }}"}, "chat_template_kwargs.chat_template"),
        ({"enable_thinking": False, "tokenize": True}, "chat_template_kwargs.tokenize"),
        ({"custom_switch": 1}, "chat_template_kwargs.custom_switch"),
        ({"enable_thinking": {"nested": "object"}}, "chat_template_kwargs.enable_thinking"),
        ("not an object", "chat_template_kwargs"),
    ],
)
def test_unlisted_template_kwargs_are_refused_and_never_sent(proxy: LiveProxy, kwargs: object, field: str) -> None:
    session_id, key = proxy.session()
    served_before = len(proxy.engine_entries())
    refused = _ask(proxy.base(key), chat_template_kwargs=kwargs)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(f"{field}: ")
    assert len(proxy.engine_entries()) == served_before  # the engine never saw it
    assert [c["status_code"] for c in proxy.calls(session_id)] == []


def test_allowed_keys_pass_and_the_list_is_configurable(proxy: LiveProxy, database_url: str, tmp_path: Path) -> None:
    session_id, key = proxy.session()
    assert _ask(proxy.base(key), chat_template_kwargs={"enable_thinking": False}).status_code == 200
    (call,) = proxy.calls(session_id)
    assert call["normalized_request"]["chat_template_kwargs"] == {"enable_thinking": False}
    with live_proxy(database_url, tmp_path / "custom", env={"POLAR_CHAT_TEMPLATE_KWARGS": "custom_switch"}) as proxy:
        _, key = proxy.session()
        assert _ask(proxy.base(key), chat_template_kwargs={"custom_switch": True}).status_code == 200
        assert _ask(proxy.base(key), chat_template_kwargs={"enable_thinking": False}).status_code == 400
