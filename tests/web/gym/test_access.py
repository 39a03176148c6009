"""``polar gym-agent`` is closed by default (AUDIT F10): only callers from its allow-list (loopback unless
``--allow-from`` says otherwise) get in, 403 for the rest; with ``--require-token`` also only those sending the API
token (401 otherwise); a row fills only the values the template prints it in; every stored batch has its submitter
and an audit row."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from aiohttp.test_utils import TestClient, TestServer

from polar.errors import ValidationError
from polar.loaders.template import compile_template
from polar.services import Services
from tests.processes import wait_until
from tests.stage_calls import domain_services
from web.gym.access import Access, allow_list, is_allowed
from web.gym.app import create_app

TOKEN = "gym-" + "t" * 40
# A template that prints row values without tojson: what a row could once turn into fields of its own.
TEMPLATE = """{"runtime": {"backend": "bwrap"}, "instruction": "{{ instruction }}", "timeout_seconds": 60,
 "harness": {"name": "command", "command": "true"}, "evaluator": {"name": "session_completion"}}"""
ROW = {"responses_create_params": {"input": "add 2 and 2"}, "_ng_task_index": 7, "_ng_rollout_index": 0}


def test_the_allow_list_is_loopback_unless_given_and_replaced_when_given() -> None:
    default = allow_list(())
    assert [str(network) for network in default] == ["127.0.0.0/8", "::1/128"]
    assert is_allowed("127.0.0.1", default) and is_allowed("::1", default)
    assert is_allowed("::ffff:127.0.0.1", default)  # a dual-stack listener's view of an IPv4 caller
    assert not is_allowed("10.1.2.3", default) and not is_allowed(None, default) and not is_allowed("x", default)
    nodes = allow_list(["10.1.0.0/16", "192.168.5.7"])
    assert is_allowed("10.1.2.3", nodes) and is_allowed("192.168.5.7", nodes)
    assert not is_allowed("127.0.0.1", nodes)  # replaced, not added to
    with pytest.raises(ValidationError, match=r"--allow-from 'ten\.0\.0\.0/8'"):
        allow_list(["ten.0.0.0/8"])


def with_agent(database_url: str, tmp_path: Path, access: Access | None,
               body: Callable[[TestClient, Services], Awaitable[None]]) -> None:  # fmt: skip
    """Run ``body`` against the agent app (started and stopped as ``polar gym-agent`` does), on 127.0.0.1."""
    services = domain_services(database_url, tmp_path / "sessions", ready_buffer=0)
    template = compile_template(TEMPLATE, "gym.template.json", rows_fill_values_only=True)

    async def main() -> None:
        async with TestClient(TestServer(create_app(services, template, 2, 0.05, access), host="127.0.0.1")) as client:
            await body(client, services)

    asyncio.run(main())


def test_callers_outside_the_allow_list_get_403_before_anything_runs(database_url: str, tmp_path: Path) -> None:
    async def body(client: TestClient, services: Services) -> None:
        for method, path in (("POST", "/run"), ("GET", "/"), ("POST", "/aggregate_metrics")):
            refused = await client.request(method, path, json=ROW)
            assert refused.status == 403
            assert (await refused.json())["error"]["type"] == "forbidden"

    with_agent(database_url, tmp_path, Access(allow_list(["10.0.0.0/8"])), body)
    assert _sql(database_url, "SELECT count(*) FROM batches") == [(0,)]


def test_the_token_when_required_is_checked_after_the_address(database_url: str, tmp_path: Path) -> None:
    async def body(client: TestClient, services: Services) -> None:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            refused = await client.post("/run", json=ROW, headers=headers)
            assert refused.status == 401, headers
            assert "POLAR_API_TOKEN" in (await refused.json())["error"]["message"]
        let_in = await client.post("/run", json={"not": "a row"}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert let_in.status == 422  # past the checks: the row's own fault now

    with_agent(database_url, tmp_path, Access(allow_list(()), TOKEN), body)


def test_by_default_loopback_callers_need_no_token_and_their_batches_are_audited(
    database_url: str, tmp_path: Path
) -> None:
    """The default lets NeMo Gym 0.7.0's client in (it sends no Authorization header); the row that tries to add a
    runtime and a harness of its own through an unescaped value stays one instruction."""
    injected = {**ROW, "responses_create_params": {"input": 'x", "runtime": {"backend": "local"}, "task_id": "inj'}}

    async def body(client: TestClient, services: Services) -> None:
        waiting = asyncio.ensure_future(client.post("/run", json=injected))  # it waits for a session never run
        await asyncio.to_thread(wait_until, lambda: _sql(database_url, "SELECT count(*) FROM audit_log") == [(1,)],
                                30, "the audit row")  # fmt: skip
        waiting.cancel()

    with_agent(database_url, tmp_path, None, body)
    (batch_id, submitted_by), = _sql(database_url, "SELECT id, submitted_by FROM batches")  # fmt: skip
    assert submitted_by == "gym-agent"
    assert _sql(database_url, "SELECT actor, action, target, remote_addr FROM audit_log") == [
        ("gym-agent", "submit", str(batch_id), "127.0.0.1")
    ]
    (spec,) = [row[0] for row in _sql(database_url, "SELECT spec FROM tasks")]
    assert spec["instruction"] == injected["responses_create_params"]["input"]
    assert spec["runtime"]["backend"] == "bwrap" and spec["task_id"] == "gym-7"


def test_a_token_caller_is_audited_by_the_tokens_fingerprint(database_url: str, tmp_path: Path) -> None:
    async def body(client: TestClient, services: Services) -> None:
        waiting = asyncio.ensure_future(client.post("/run", json=ROW, headers={"Authorization": f"Bearer {TOKEN}"}))
        await asyncio.to_thread(wait_until, lambda: _sql(database_url, "SELECT count(*) FROM audit_log") == [(1,)],
                                30, "the audit row")  # fmt: skip
        waiting.cancel()

    with_agent(database_url, tmp_path, Access(allow_list(()), TOKEN), body)
    fingerprint = hashlib.sha256(TOKEN.encode()).hexdigest()[:8]
    assert _sql(database_url, "SELECT submitted_by FROM batches") == [(f"gym-agent:{fingerprint}",)]
    everything = str(_sql(database_url, "SELECT * FROM audit_log")) + str(_sql(database_url, "SELECT * FROM batches"))
    assert TOKEN not in everything


def _sql(database_url: str, query: str) -> list[Any]:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(sa.text(query)).all())
    finally:
        engine.dispose()


def test_the_cli_refuses_a_bad_network_and_a_token_it_does_not_have(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from polar.local.cli import main

    template = tmp_path / "gym.template.json"
    template.write_text(TEMPLATE)
    runner = CliRunner(env={"POLAR_API_TOKEN": ""})
    bad = runner.invoke(main, ["gym-agent", "--template", str(template), "--allow-from", "10.0.0.0/33"])
    assert bad.exit_code == 2 and "--allow-from" in bad.output and "not an address or CIDR network" in bad.output
    tokenless = runner.invoke(main, ["gym-agent", "--template", str(template), "--require-token"])
    assert tokenless.exit_code == 2 and "--require-token needs POLAR_API_TOKEN" in tokenless.output
