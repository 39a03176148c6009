"""The token ids TITO appends after a chain (``polar.proxy.tito``): the chat template's rendering of the messages
that came after the linked call's answer, and the generation prompt.

The tail is found without knowing the template: the conversation is rendered with the linked assistant turn
replaced by a sentinel, and everything after the sentinel (less the end-of-turn token the model already sampled) is
the tail, tokenised alone.

Rendering the whole conversation costs the engine a tokenisation of all of it (32k tokens: 25-38 ms on the
reference engine, most of a TITO call). What comes after the sentinel is the template's rendering of the later
messages, which does not read the earlier messages' text; so the history before the sentinel is sent as a
*skeleton*: every message kept, in order, with its role, its tool-call ids and names, and its text left out (and
no tool schemas), a few hundred tokens however long the conversation. The first continuation this process makes
for each (session, agent) renders both and compares the tails: equal, that agent's later calls render the skeleton
only; different (a template that reads earlier text into later turns, or refuses the skeleton), they render the
whole conversation, as before, and a warning says so. Whatever is appended, the trajectory holds the ids the engine
was actually given.

Finding the tail in a render takes two more round trips: decode the render to find the sentinel, then tokenise the
text after it alone (on the reference engine, 5 of a TITO call's ~10 ms of tail-finding at 32k tokens). The render's
own ids already hold the tail, tokenised in context: the ids after the sentinel's (less the sampled end-of-turn id).
They equal the tail tokenised alone when the template puts a token boundary on both sides of the sentinel, as
special end-of-turn tokens do; so the same first continuation checks that too, and while it holds, an agent's later
tails cost one round trip, the skeleton's render.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from polar.fleet.engines import EnginePool
from polar.reconstruction.prefix_merging import common_prefix

if TYPE_CHECKING:
    from polar.proxy.tito import ChainLink

log = logging.getLogger(__name__)

SENTINEL = "\u2063POLAR-TITO-SENTINEL\u2063"
T = TypeVar("T")
VERDICTS_KEPT = 100_000  # (session, agent) pairs a process remembers its check for (least recently used out)


@dataclass(frozen=True)
class Verdict:
    """What the first continuation of a (session, agent) found: whether the skeleton's tail is the whole
    conversation's, and whether the skeleton render's own ids after the sentinel are that tail."""

    skeleton: bool
    in_context: bool = False


class TailRenders:
    """What one proxy process learns while rendering tails: per (session, agent), its ``Verdict``; per (model, token
    id), an end-of-turn token's text; per model, the sentinel's ids. Thread-safe, bounded."""

    def __init__(self, kept: int = VERDICTS_KEPT) -> None:
        self._kept = kept
        self._verdicts: OrderedDict[tuple[uuid.UUID, str | None], Verdict] = OrderedDict()
        self._texts: dict[tuple[str | None, int], str] = {}
        self._sentinels: dict[str | None, list[int]] = {}
        self._lock = threading.Lock()

    def verdict(self, session_id: uuid.UUID, agent: str | None) -> Verdict | None:
        with self._lock:
            found = self._verdicts.get((session_id, agent))
            if found is not None:
                self._verdicts.move_to_end((session_id, agent))
            return found

    def judge(self, session_id: uuid.UUID, agent: str | None, verdict: Verdict) -> None:
        with self._lock:
            self._verdicts[(session_id, agent)] = verdict
            while len(self._verdicts) > self._kept:
                self._verdicts.popitem(last=False)

    def sentinel_ids(self, engines: EnginePool, session_id: uuid.UUID, model: str | None) -> list[int] | None:
        """The sentinel tokenised alone (once per model; None: the engine would not)."""
        body = {"prompt": SENTINEL, "add_special_tokens": False}
        return self._known(self._sentinels, model, lambda: _tokenize(engines, session_id, body, model) or None)

    def token_text(self, engines: EnginePool, session_id: uuid.UUID, token: int, model: str | None) -> str | None:
        """The text of one id (the sampled end-of-turn token, the same few ids all session long)."""
        return self._known(self._texts, (model, token), lambda: _detokenize(engines, session_id, [token], model))

    def _known(self, store: dict[Any, T], key: Any, ask: Callable[[], T | None]) -> T | None:
        """``store[key]``, asked of the engine until it answers (a refusal, None, is not kept); bounded."""
        with self._lock:
            found = store.get(key)
        if found is None:
            found = ask()
            if found is not None:
                with self._lock:
                    if len(store) >= self._kept:
                        store.clear()
                    store[key] = found
        return found


def prompt_ids(
    engines: EnginePool,
    renders: TailRenders,
    session_id: uuid.UUID,
    agent: str | None,
    link: ChainLink,
    engine_body: dict[str, Any],
    model: str | None,
) -> list[int] | None:
    """The TITO prompt: ``link``'s prompt and sampled ids, then the tail rendered after them. None when the engine
    cannot build the tail (it refuses to render or decode, or the sentinel does not come back): the call is then
    asked from its messages, as when no link is found, and the engine's own 400 reaches the client, never a 500."""
    verdict = renders.verdict(session_id, agent)
    if verdict is None:
        tail = _judged_tail(engines, renders, session_id, agent, link, engine_body, model)
    else:
        tail = None
        if verdict.skeleton:
            tail = _skeleton_tail(engines, renders, session_id, link, engine_body, model, verdict.in_context)
        if tail is None:  # the whole conversation's, or a skeleton the template refused this once
            conversation = _conversation(engine_body, link.message_index)
            tail = _tail(engines, renders, session_id, link, conversation, link.prompt_ids, model)
    return None if tail is None else [*link.prompt_ids, *link.completion_ids, *tail]


def _skeleton_tail(
    engines: EnginePool,
    renders: TailRenders,
    session_id: uuid.UUID,
    link: ChainLink,
    engine_body: dict[str, Any],
    model: str | None,
    in_context: bool,
) -> list[int] | None:
    tokens = _tokenize(engines, session_id, _skeleton(engine_body, link.message_index), model)
    if tokens is None:
        return None
    found = _in_context(tokens, renders.sentinel_ids(engines, session_id, model), link) if in_context else None
    return found if found is not None else _tail_of(engines, renders, session_id, link, tokens, None, model)


def _judged_tail(
    engines: EnginePool,
    renders: TailRenders,
    session_id: uuid.UUID,
    agent: str | None,
    link: ChainLink,
    engine_body: dict[str, Any],
    model: str | None,
) -> list[int] | None:
    """The first continuation of (session, agent): the tail after the whole conversation, which decides how later
    ones are rendered (``Verdict``): by the skeleton when its tail is the same, in one round trip when the
    skeleton render's own ids give it too. A skeleton the template refused (None) is judged too."""
    tokens = _tokenize(engines, session_id, _skeleton(engine_body, link.message_index), model)
    short = None if tokens is None else _tail_of(engines, renders, session_id, link, tokens, None, model)
    conversation = _conversation(engine_body, link.message_index)
    tail = _tail(engines, renders, session_id, link, conversation, link.prompt_ids, model)
    if tail is None:
        return None
    in_context = None
    if tokens is not None and short == tail:
        in_context = _in_context(tokens, renders.sentinel_ids(engines, session_id, model), link)
    renders.judge(session_id, agent, Verdict(short == tail, in_context == tail))
    if short != tail:
        log.warning("TITO: this template renders later turns from earlier text, or refuses their skeleton; "
                    "session %s (agent %s) renders the whole conversation for every tail", session_id,
                    agent)  # fmt: skip
    return tail


def _in_context(tokens: Sequence[int], sentinel: Sequence[int] | None, link: ChainLink) -> list[int] | None:
    """The ids after the sentinel's in a render, less the end-of-turn id the model sampled itself; None when the
    sentinel's ids are not there (the template's text merged with its edges)."""
    if not sentinel:
        return None
    width, first = len(sentinel), sentinel[0]
    at = len(tokens) - width
    while at >= 0 and not (tokens[at] == first and list(tokens[at : at + width]) == list(sentinel)):
        at -= 1
    if at < 0:
        return None
    rest = list(tokens[at + width :])
    if link.finish_reason != "length" and link.completion_ids and rest[:1] == [link.completion_ids[-1]]:
        del rest[0]
    return rest


def _conversation(engine_body: dict[str, Any], index: int) -> dict[str, Any]:
    """The ``/tokenize`` request of the conversation with the linked answer replaced by the sentinel."""
    messages = list(engine_body["messages"])
    messages[index] = {"role": "assistant", "content": SENTINEL}
    render: dict[str, Any] = {"messages": messages, "add_generation_prompt": True}
    if engine_body.get("tools"):
        render["tools"] = engine_body["tools"]
    if engine_body.get("chat_template_kwargs"):
        render["chat_template_kwargs"] = engine_body["chat_template_kwargs"]
    return render


def _skeleton(engine_body: dict[str, Any], index: int) -> dict[str, Any]:
    """``_conversation`` with the messages before the sentinel reduced to their shape, and no tool schemas."""
    messages = engine_body["messages"]
    shapes = [*map(_shape, messages[:index]), {"role": "assistant", "content": SENTINEL}]
    render: dict[str, Any] = {"messages": [*shapes, *messages[index + 1 :]], "add_generation_prompt": True}
    if engine_body.get("chat_template_kwargs"):
        render["chat_template_kwargs"] = engine_body["chat_template_kwargs"]
    return render


def _shape(message: Any) -> dict[str, Any]:
    """A message's role and the ids that tie tool calls to their results, with no text."""
    shape: dict[str, Any] = {"role": message.get("role"), "content": ""}
    if message.get("tool_call_id") is not None:
        shape["tool_call_id"] = message["tool_call_id"]
    if message.get("name") is not None:
        shape["name"] = message["name"]
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        shape["tool_calls"] = [_call_shape(call) for call in calls]
    return shape


def _call_shape(call: Any) -> dict[str, Any]:
    function = (call.get("function") if isinstance(call, dict) else None) or {}
    shape = {"type": "function", "function": {"name": str(function.get("name") or ""), "arguments": "{}"}}
    if isinstance(call, dict) and call.get("id") is not None:
        shape["id"] = call["id"]
    return shape


def _tail(
    engines: EnginePool,
    renders: TailRenders,
    session_id: uuid.UUID,
    link: ChainLink,
    render: dict[str, Any],
    prompt_before: Sequence[int] | None,
    model: str | None,
) -> list[int] | None:
    """The tail's ids from one render (``_tail_of`` its tokens)."""
    tokens = _tokenize(engines, session_id, render, model)
    return None if tokens is None else _tail_of(engines, renders, session_id, link, tokens, prompt_before, model)


def _tail_of(
    engines: EnginePool,
    renders: TailRenders,
    session_id: uuid.UUID,
    link: ChainLink,
    tokens: Sequence[int],
    prompt_before: Sequence[int] | None,
    model: str | None,
) -> list[int] | None:
    """The text after the sentinel in a render's ``tokens``, tokenised alone. With ``prompt_before`` (the render
    repeats that prompt), only the text past what the two share is decoded (a few hundred tokens of tens of
    thousands), from one token earlier in case the cut splits a character, and the whole text if that misses the
    sentinel."""
    start = 0 if prompt_before is None else max(0, common_prefix(tokens, prompt_before) - 1)
    text = _detokenize(engines, session_id, tokens[start:], model)
    if (text is None or SENTINEL not in text) and start:
        text = _detokenize(engines, session_id, tokens, model)
    if text is None or SENTINEL not in text:
        log.warning("TITO: the sentinel did not come back from the template; asking from the messages")
        return None
    tail = text[text.index(SENTINEL) + len(SENTINEL) :]
    if link.finish_reason != "length" and link.completion_ids:
        end_of_turn = renders.token_text(engines, session_id, link.completion_ids[-1], model)
        if end_of_turn is None:
            return None
        tail = tail.removeprefix(end_of_turn)  # the model sampled the end of its turn itself
    return _tokenize(engines, session_id, {"prompt": tail, "add_special_tokens": False}, model)


def _tokenize(engines: EnginePool, session_id: uuid.UUID, body: dict[str, Any], model: str | None) -> list[int] | None:
    """The ids, or None when the engine refused (a 4xx: a template's ``raise_exception``, a message it cannot
    render); an engine failure (5xx, unreachable) raises ``EngineError`` as for any engine call."""
    reply = engines.post(session_id, "/tokenize", body, model)
    tokens = reply.body.get("tokens") if reply.status_code == 200 else None
    if not isinstance(tokens, list):
        log.warning("TITO: the engine's /tokenize refused the conversation (%s): %s", reply.status_code,
                    reply.error_message[:300])  # fmt: skip
        return None
    return list(tokens)


def _detokenize(engines: EnginePool, session_id: uuid.UUID, tokens: Sequence[int], model: str | None) -> str | None:
    """The text, or None when the engine refused (a 4xx: an id outside its vocabulary)."""
    reply = engines.post(session_id, "/detokenize", {"tokens": list(tokens)}, model)
    text = reply.body.get("prompt") if reply.status_code == 200 else None
    if not isinstance(text, str):
        log.warning("TITO: the engine's /detokenize refused %d ids (%s)", len(tokens), reply.status_code)
        return None
    return text
