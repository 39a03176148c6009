"""The proxy alone under gunicorn, in front of the reference engine or the run's real vLLM server, with the
running sessions it serves made on demand."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from polar.local.launcher import Stack, engine_spec, free_port, gunicorn_spec
from polar.proxy.keys import hash_key
from polar.services import Services
from polar.storage.models import Session
from tests.processes import HANG_GUARD_S
from tests.real_vllm import SharedVllm, route_env
from tests.stacks import _live, engine_entries
from tests.stage_calls import command_task, domain_services, submit_tasks


@dataclass
class LiveProxy:
    """The proxy under gunicorn in front of an engine, with sessions made ``running`` on demand. The engine is the
    reference engine speaking vLLM's protocol (``engine_api="vllm"``) or SGLang's (``"sglang"``), or the run's
    real vLLM server (``"real-vllm"``; its calls go down ``route``: tests/real_vllm.py)."""

    url: str
    services: Services
    engine_url: str
    engine_log: Path
    engine_api: str = "vllm"
    tokenizer_dir: Path | None = None  # sglang: the tokenizer directory the proxy renders prompts with
    real: SharedVllm | None = None
    route: str | None = None

    @property
    def engine_kind(self) -> str:
        """The kind Polar records for the engine (``model_calls.engine_kind``)."""
        return "sglang" if self.engine_api == "sglang" else "vllm"

    def prompt_ids(self, normalized_request: dict[str, Any]) -> list[int]:
        """What the prompt of a captured call must be, from the engine side: the engine's own ``/tokenize`` of the
        chat form (vLLM), or the model's template in the tokenizer directory (SGLang: Polar renders)."""
        if self.engine_api == "sglang":
            from polar.fleet.renderers import ChatRenderer

            assert self.tokenizer_dir is not None
            return ChatRenderer.load(str(self.tokenizer_dir)).prompt_ids(normalized_request["polar_chat"])
        keys = ("model", "messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")
        body = {k: normalized_request[k] for k in keys if k in normalized_request}
        return list(httpx.post(f"{self.engine_url}/tokenize", json=body, timeout=HANG_GUARD_S).json()["tokens"])

    def sampling(self, call: dict[str, Any], name: str) -> Any:
        """A sampling field the engine got for a call: the chat request's (vLLM), or its ``/generate`` translation
        (SGLang: ``max_tokens`` is ``max_new_tokens`` under ``sampling_params``)."""
        sent = call["normalized_request"]
        if self.engine_api == "sglang":
            return sent["sampling_params"][{"max_tokens": "max_new_tokens"}.get(name, name)]
        return sent[name]

    def logged(self, entries: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
        """The engine log's entry for a captured call (SGLang's request ids lack the ``chatcmpl-`` prefix); for real
        vLLM, what it sampled on the call's prompt, as logged from inside vLLM."""
        if self.real is not None:
            record = self.real.sampled_for(call["prompt_token_ids"], self.route)
            stop = (call["response"].get("choices") or [{}])[0].get("stop_reason")
            if call["finish_reason"] == "stop" and isinstance(stop, str):
                # vLLM matches stop strings in its front end, after the engine core sampled past them: the core
                # ran on until the abort reached it. What the client was answered ends at the stop.
                record = {**record, "token_ids": record["token_ids"][: len(call["completion_token_ids"])]}
            return record
        answer_id = str(call["response"]["id"])
        return entries[answer_id.removeprefix("chatcmpl-") if self.engine_api == "sglang" else answer_id]

    def session(self, **task: Any) -> tuple[uuid.UUID, str]:
        """A new running session (its task given ``task`` fields) and its proxy key."""
        return self.batch(task)[0]

    def batch(self, *tasks: dict[str, Any]) -> list[tuple[uuid.UUID, str]]:
        """One batch of ``tasks`` (fields of command tasks), every session running: ``(session id, key)`` each,
        in task order."""
        from polar.contract.task_request import parse_batch_request
        from polar.lifecycle.batches import request_hash, submit_batch
        from polar.proxy.keys import hash_key
        from polar.storage.models import Session

        body = {"tasks": [command_task(f"protocol-test-{i:03d}", "true", **task) for i, task in enumerate(tasks)]}
        batch_id = submit_batch(self.services, parse_batch_request(body), request_hash(body)).batch_id
        running = []
        with self.services.db.unit() as db:
            query = sa.select(Session.id).where(Session.batch_id == batch_id)
            for session_id in db.scalars(query.order_by(Session.task_id, Session.sample_index)).all():
                key = "pk-" + uuid.uuid4().hex
                running_now = {"state": "running", "proxy_key_hash": hash_key(key)}
                db.execute(sa.update(Session).where(Session.id == session_id).values(**running_now))
                running.append((session_id, key))
        return running

    def base(self, key: str) -> str:
        return f"{self.url}/s/{key}"

    def calls(self, session_id: uuid.UUID) -> list[dict[str, Any]]:
        from polar.lifecycle.sessions import session_calls

        return session_calls(self.services, session_id)

    def engine_entries(self) -> dict[str, dict[str, Any]]:
        """The reference engine's log by request id (real vLLM logs no request ids: see :meth:`logged`)."""
        return {} if self.real is not None else engine_entries(self.engine_log)


@contextmanager
def real_vllm_proxy(database_url: str, tmp: Path, shared: SharedVllm, route: str,
                    overrides: Mapping[str, Any] | None = None) -> Iterator[LiveProxy]:  # fmt: skip
    """The proxy alone, in front of the run's real vLLM server, sending its calls down ``route`` (with more
    engine-body ``overrides``, as an operator's POLAR_SAMPLING_OVERRIDES)."""
    proxy_port = free_port()
    stack_env = {
        "POLAR_DATABASE_URL": database_url,
        "POLAR_ENGINE_URLS": shared.url,
        **route_env(route, **(overrides or {})),
    }
    stack = Stack([gunicorn_spec("proxy", "web.proxy:create_app()", proxy_port)], stack_env, tmp / "logs")
    with _live(stack):
        services = domain_services(database_url, tmp)
        try:
            yield LiveProxy(f"http://127.0.0.1:{proxy_port}", services, shared.url, shared.sample_log, "real-vllm",
                            real=shared, route=route)  # fmt: skip
        finally:
            services.db.dispose()


@contextmanager
def live_proxy(
    database_url: str,
    tmp: Path,
    policy: str = "scripted",
    policy_config: str = "{}",
    env: Mapping[str, str] | None = None,
    engine_args: tuple[str, ...] = (),
    engines_before: tuple[str, ...] = (),
    engine_api: str = "vllm",
) -> Iterator[LiveProxy]:
    """With ``engine_api="sglang"`` the reference engine speaks SGLang's native API and the proxy renders prompts
    with the engine's exported tokenizer directory (``POLAR_ENGINE_TOKENIZER``)."""
    engine_port, proxy_port = free_port(), free_port()
    engine_log = tmp / "engine-requests.jsonl"
    prefix = "sglang+" if engine_api == "sglang" else ""
    engine_urls = ",".join([*engines_before, f"{prefix}http://127.0.0.1:{engine_port}"])
    stack_env = {"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": engine_urls, **(env or {})}
    tokenizer_dir = None
    if engine_api == "sglang":
        from polar.chat.hf_export import export_tokenizer

        tokenizer_dir = export_tokenizer(tmp / "tokenizer")
        stack_env["POLAR_ENGINE_TOKENIZER"] = str(tokenizer_dir)
        engine_args = (*engine_args, "--api", "sglang")
    args = ["--policy-config", policy_config, "--log", str(engine_log), *engine_args]
    stack = Stack(
        [engine_spec(engine_port, policy, args), gunicorn_spec("proxy", "web.proxy:create_app()", proxy_port)],
        stack_env,
        tmp / "logs",
    )
    with _live(stack):
        services = domain_services(database_url, tmp)
        try:
            yield LiveProxy(f"http://127.0.0.1:{proxy_port}", services, f"http://127.0.0.1:{engine_port}", engine_log,
                            engine_api, tokenizer_dir)  # fmt: skip
        finally:
            services.db.dispose()


def running_proxy_session(database_url: str, work_root: Path, task: dict[str, Any]) -> tuple[uuid.UUID, str]:
    """``task`` (one sample) submitted and its session marked running under a new proxy key: a session a proxy
    test can call with, without a run worker. Returns the session's id and its key."""
    services = domain_services(database_url, work_root)
    submit_tasks(services, task)
    key = "pk-" + uuid.uuid4().hex
    with services.db.unit() as db:
        session_id = db.scalar(sa.select(Session.id))
        db.execute(sa.update(Session).values(state="running", proxy_key_hash=hash_key(key)))
    services.db.dispose()
    assert session_id is not None
    return session_id, key
