"""``polar gym-agent``: NeMo Gym's agent-server contract over Polar's pipeline.

    POST /run     a dataset row -> the row + ``response`` (token-carrying output items) + ``reward``
                  (status codes: ``polar.gym.answers``; 400/422 for a row that cannot run, the reason in ``error``)
    POST /aggregate_metrics   NeMo Gym's end-of-run summary (``gym eval``; NeMo RL's training does not call it):
                  the mean reward and the masked count of the answers posted back
    GET  /        liveness, and how many rows are waiting

Every route first checks its caller (``web.gym.access``: the peer's address against the allow-list, loopback by
default, and the bearer token with ``--require-token``); each stored batch records the caller as its submitter
and leaves an audit row.

Each ``/run`` row becomes one session of a batch (``Submitter``: the rows that arrive together share a batch and a
transaction) and waits for its sample to settle (``SettlementWaiter``: one poll for every waiting row, which also
reads the settled sessions' calls). The blocking parts (Postgres, the engine probe at submission, Celery's send)
run on a small thread pool; a waiting row holds only a coroutine, so one process holds thousands of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jinja2
import orjson
import sqlalchemy as sa
from aiohttp import web

from polar.errors import PolarError, ValidationError
from polar.gym.answers import PERSISTENCE_FAILED, Answer, gym_answer
from polar.gym.rows import check_row, row_where
from polar.records.audit import Caller
from polar.services import Services
from web.gym.access import CALLER, Access, allow_list, middleware
from web.gym.submitter import Submitter
from web.gym.waiter import SettlementWaiter

log = logging.getLogger(__name__)
DEFAULT_THREADS = 8


@dataclass
class GymAgent:
    submitter: Submitter
    waiter: SettlementWaiter
    all_chains: bool = False  # answer every call of a session, side calls included (default: its main chain)

    async def run(self, row: dict[str, Any], caller: Caller) -> Answer:
        sample = await self.submitter.submit(row, caller)
        settled, calls = await self.waiter.settled(sample)
        model = str(row["responses_create_params"].get("model") or "polar")
        return gym_answer(row, settled, calls, model, self.all_chains)


AGENT = web.AppKey("agent", GymAgent)


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _error(status: int, message: str, kind: str, failure_kind: str | None = None) -> web.Response:
    body: dict[str, Any] = {"error": {"message": message, "type": kind}}
    if failure_kind is not None:  # NeMo Gym's name for it (polar.gym.answers)
        body |= {"failure_kind": failure_kind, "failure_reason": message}
    return _json(status, body)


async def run(request: web.Request) -> web.Response:
    agent = request.app[AGENT]
    try:
        row = check_row(orjson.loads(await request.read()))
    except orjson.JSONDecodeError as exc:
        return _error(400, f"the body is not JSON: {exc}", "invalid_request")
    except ValidationError as exc:
        return _error(422, str(exc), "invalid_row")
    try:
        answer = await agent.run(row, request[CALLER])
    except ValidationError as exc:  # the template rendered a task Polar refuses: the row's (or template's) fault
        return _error(422, str(exc), "invalid_task")
    except (PolarError, sa.exc.SQLAlchemyError, OSError) as exc:  # Polar could not run it now: NeMo RL retries 5xx
        log.warning("gym agent: %s could not run: %s", row_where(row), exc)
        return _error(503, f"Polar could not run the row: {exc}", "unavailable", PERSISTENCE_FAILED)
    return _json(answer.status, answer.body)


async def aggregate_metrics(request: web.Request) -> web.Response:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return _error(400, f"the body is not JSON: {exc}", "invalid_request")
    answers = body.get("verify_responses") if isinstance(body, dict) else None
    if not isinstance(answers, list) or not all(isinstance(a, dict) for a in answers):
        return _error(422, "verify_responses: required, a list of /run answers", "invalid_request")
    rewards = [float(a["reward"]) for a in answers if isinstance(a.get("reward"), int | float)]
    masked = sum(1 for a in answers if a.get("mask_sample") or (a.get("instance_config") or {}).get("mask_sample"))
    metrics = {"mean/reward": sum(rewards) / len(rewards) if rewards else 0.0, "rows": len(answers), "masked": masked}
    return _json(200, {"group_level_metrics": [], "agent_metrics": metrics, "key_metrics": metrics})


async def alive(request: web.Request) -> web.Response:
    return _json(200, {"status": "ok", "waiting": len(request.app[AGENT].waiter.waiting)})


def create_app(
    services: Services,
    template: jinja2.Template,
    threads: int = DEFAULT_THREADS,
    poll_s: float = 0.25,
    access: Access | None = None,
    all_chains: bool = False,
) -> web.Application:
    """The agent app; its waiter loop starts and stops with the app, the database closes with it. ``access``:
    who may call it (default: loopback callers, no token); ``all_chains``: answer side calls too."""
    executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gym-agent")

    def on_pool(function: Any, *args: Any) -> Awaitable[Any]:  # the blocking parts, off the event loop
        return asyncio.get_running_loop().run_in_executor(executor, function, *args)

    agent = GymAgent(Submitter(services, template, on_pool), SettlementWaiter(services, on_pool, poll_s), all_chains)
    # A row may carry a long conversation; the caller is checked before its body is read.
    app = web.Application(client_max_size=64 * 1024 * 1024,
                          middlewares=[middleware(access or Access(allow_list(())))])  # fmt: skip
    app[AGENT] = agent
    app.router.add_post("/run", run)
    app.router.add_post("/aggregate_metrics", aggregate_metrics)
    app.router.add_get("/", alive)

    async def lifecycle(app: web.Application) -> Any:
        loops = [asyncio.create_task(agent.submitter.run()), asyncio.create_task(agent.waiter.run())]
        yield
        for loop in loops:
            loop.cancel()
        executor.shutdown(wait=False, cancel_futures=True)
        services.db.dispose()

    app.cleanup_ctx.append(lifecycle)
    return app
