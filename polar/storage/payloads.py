"""Captured JSON payloads stored as deltas on an earlier call, so a session's bytes grow linearly with its length.

Every call of an agent resends the whole conversation: its request, normalised request and response each repeat
what the previous call held, plus a turn. A call whose ``payload_parent_id`` is set stores each of the three as a
delta on the same payload of that parent (an earlier call of the same session); the parent's own ``payload_index``
(a few hashes, computed here when the parent was captured) is all the capture path needs to read to write it:

    stored, index = capture_payload(payload, parent_index, prompt)  # a delta on the parent, and this call's index
    payload = decode_payload(stored, parent_payload, prompt)       # exactly the payload again, key order included

A delta is a list of operations, one per key of the payload object, in the payload's key order:

    [key, "="]                the parent's value under key
    [key, "v", value]         this value
    [key, "+", n, items]      the parent's list under key, its first n items, then items
    [key, "{", ops]           the parent's object under key, changed by the nested ops
    [key, "t"]                this call's own full prompt token ids (a response's ``prompt_token_ids``)

Lists are compared through prefix hashes at a few positions (powers of two and the last four), so a history that
was only appended to, or whose last few messages were rewritten (a moved cache marker), costs what was added. A
payload that is not an object is stored whole. In SQL, ``polar_call_payload(id, part)`` and the view
``model_calls_full`` rebuild the same JSON (migration 0010).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

from polar.codec.json_body import dump_json
from polar.errors import PolarError

PARTS = ("request", "normalized_request", "response")
_DIGEST_SIZE = 12  # 96-bit hashes: a false "same" is never the likely explanation of anything
_TAIL = 4  # list positions kept at the end: the last few messages may be rewritten turn to turn
_MAX_DEPTH = 3  # objects nested deeper than this are compared whole
_NOT_LOADED = None  # where a "t" goes in a payload rebuilt without its call's prompt


def _hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=_DIGEST_SIZE).hexdigest()


def _positions(length: int) -> list[int]:
    """The prefix lengths a list's index records: 1, 2, 4, 8, … and the last ``_TAIL``."""
    kept, power = set(range(max(1, length - _TAIL + 1), length + 1)), 1
    while power < length:
        kept.add(power)
        power *= 2
    return sorted(kept)


class Written:
    """What one capture has serialised and hashed, by object identity (its objects stay alive while it runs): a
    call's request and normalised request share their messages and tools (``normalize`` builds new dicts around the
    client's objects), ~100 items at agent size, so the second is read from here."""

    def __init__(self) -> None:
        self.dumps: dict[int, bytes] = {}
        self.prefixes: dict[tuple[tuple[int, ...], tuple[int, ...]], dict[int, str]] = {}
        # Whether a payload walked without its call's prompt held a list of ints, which the prompt might have
        # equalled (stored as "t"): a capture computed before the prompt was known is then not the same.
        self.int_lists = False


def _written(item: Any, written: Written | None) -> bytes:
    """``dump_json(item)``, once per object in a capture."""
    if written is None:
        return dump_json(item)
    data = written.dumps.get(id(item))
    if data is None:
        data = written.dumps[id(item)] = dump_json(item)
    return data


def _prefix_hashes(items: Sequence[Any], positions: Iterable[int], written: Written | None = None) -> dict[int, str]:
    """Hashes of ``items[:n]`` for each wanted ``n`` (one pass: each item is serialised once)."""
    wanted = sorted(n for n in set(positions) if 0 < n <= len(items))
    key = (tuple(map(id, items)), tuple(wanted)) if written is not None else None
    if written is not None and key in written.prefixes:
        return written.prefixes[key]
    digest, done, found = hashlib.blake2b(digest_size=_DIGEST_SIZE), 0, {}
    for n in wanted:
        for item in items[done:n]:
            data = _written(item, written)
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
        done = n
        found[n] = digest.copy().hexdigest()
    if written is not None and key is not None:
        written.prefixes[key] = found
    return found


def _is_prompt(value: Any, prompt: Sequence[int] | None) -> bool:
    if value is prompt:  # the answer's own ids (not copied): no element-by-element comparison
        return bool(prompt)
    return prompt is not None and isinstance(value, list) and len(value) == len(prompt) > 0 and value == prompt


def _walk(
    payload: dict[str, Any],
    parent: Mapping[str, Any] | None,
    prompt: Sequence[int] | None,
    depth: int,
    written: Written | None = None,
) -> tuple[dict[str, Any], list[list[Any]]]:
    """This object's index and its delta ops against the parent's index (``parent`` None: no ops wanted), in one
    pass: each list item and each other value is serialised once."""
    index: dict[str, Any] = {}
    ops: list[list[Any]] = []
    for key, value in payload.items():
        entry = (parent or {}).get(key) or {}
        if written is not None and prompt is None and isinstance(value, list) and value and isinstance(value[0], int):
            written.int_lists = True
        if _is_prompt(value, prompt):
            index[key], op = {"t": 1}, [key, "t"]
        elif isinstance(value, list) and value and depth < _MAX_DEPTH:
            recorded = {int(n): h for n, h in entry.get("l", {}).items()}
            hashes = _prefix_hashes(value, {*_positions(len(value)), *recorded}, written)
            index[key] = {"l": {str(n): hashes[n] for n in _positions(len(value))}, "n": len(value)}
            shared = max((n for n, h in recorded.items() if hashes.get(n) == h), default=0)
            if shared == len(value) == entry.get("n"):
                op = [key, "="]
            else:
                op = [key, "+", shared, value[shared:]] if shared else [key, "v", value]
        elif isinstance(value, dict) and value and depth < _MAX_DEPTH:
            nested_index, nested_ops = _walk(
                value, entry.get("o") if "o" in entry else None, prompt, depth + 1, written
            )
            index[key] = {"o": nested_index}
            same = "o" in entry and list(value) == list(entry["o"]) and all(o[1] == "=" for o in nested_ops)
            op = [key, "="] if same else [key, "{", nested_ops] if "o" in entry else [key, "v", value]
        else:
            index[key] = {"h": _hash(_written(value, written))}
            op = [key, "="] if entry.get("h") == index[key]["h"] else [key, "v", value]
        ops.append(op)
    return index, ops


def capture_payload(
    payload: Any,
    parent_index: Mapping[str, Any] | None,
    prompt: Sequence[int] | None = None,
    written: Written | None = None,
) -> tuple[Any, dict[str, Any] | None]:
    """``(stored, index)`` for a payload being captured: ``stored`` is the payload itself when there is no parent
    (``parent_index`` None), else ``{"delta": ops}`` against the parent's index, or ``{"value": payload}`` when
    either is not an object; ``index`` is what a later call diffs against (None for a payload that is not an
    object). ``prompt`` is the call's full prompt: a value equal to it is stored as a reference. ``written``, shared by
    the payloads of one call, serialises an object they share once."""
    if not isinstance(payload, dict):
        return (payload if parent_index is None else {"value": payload}), None
    index, ops = _walk(payload, parent_index or {}, prompt, 0, written)
    if parent_index is None:
        return payload, index
    return {"delta": ops}, index


def _apply(ops: Sequence[Sequence[Any]], parent: Any, prompt: Sequence[int] | None) -> dict[str, Any]:
    base = parent if isinstance(parent, dict) else {}
    value: dict[str, Any] = {}
    for op in ops:
        key, kind = op[0], op[1]
        if kind == "=":
            value[key] = base[key]
        elif kind == "v":
            value[key] = op[2]
        elif kind == "+":
            value[key] = [*base[key][: op[2]], *op[3]]
        elif kind == "{":
            value[key] = _apply(op[2], base.get(key), prompt)
        elif kind == "t":
            value[key] = _NOT_LOADED if prompt is None else list(prompt)
        else:
            raise PolarError(f"unknown payload delta operation {kind!r}")
    return value


def decode_payload(stored: Any, parent: Any, prompt: Sequence[int] | None) -> Any:
    """The payload a call captured, from what it stored (``capture_payload``'s form), its parent's payload and
    its own full prompt (None: the prompt's place is left unfilled, for a payload read only as a parent)."""
    if not isinstance(stored, dict) or len(stored) != 1 or not ("delta" in stored or "value" in stored):
        raise PolarError("a delta-stored payload must be {'delta': [...]} or {'value': ...}")
    if "value" in stored:
        return stored["value"]
    try:
        return _apply(stored["delta"], parent, prompt)
    except (KeyError, TypeError, IndexError) as exc:
        raise PolarError(f"a payload delta does not fit its parent's payload: {exc!r}") from exc


class StoredPayloads(Protocol):
    """What ``full_payloads`` reads of a ``model_calls`` row (an ORM object or a Core row)."""

    @property
    def id(self) -> Any: ...
    @property
    def payload_parent_id(self) -> Any: ...
    @property
    def request(self) -> Any: ...
    @property
    def normalized_request(self) -> Any: ...
    @property
    def response(self) -> Any: ...


def full_payloads(
    rows: Iterable[StoredPayloads],
    prompts: Mapping[Any, Sequence[int]],
    wanted: Collection[Any] | None = None,
    parts: Sequence[str] = PARTS,
) -> dict[Any, dict[str, Any]]:
    """The payloads (``{"request": …, "normalized_request": …, "response": …}``, or the ``parts`` asked for) of
    ``wanted`` rows (default: every row) by call id. ``rows`` come in ``seq`` order and include each wanted row's
    payload ancestors (earlier calls of the same session: the session's calls up to the last one wanted always
    suffice); ``prompts`` holds the wanted rows' full prompts. A later call never refers to the place an earlier
    call's own prompt took (it would store its own), so rows read only as parents are rebuilt without theirs."""
    payloads: dict[Any, dict[str, Any]] = {}
    for row in rows:
        stored = {part: getattr(row, part) for part in parts}
        if row.payload_parent_id is None:
            payloads[row.id] = stored
            continue
        parent = payloads.get(row.payload_parent_id)
        if parent is None:
            raise PolarError(f"call {row.id}: its payload parent {row.payload_parent_id} was not loaded first")
        prompt = prompts.get(row.id) if wanted is None or row.id in wanted else None
        payloads[row.id] = {part: decode_payload(stored[part], parent[part], prompt) for part in parts}
    if wanted is None:
        return payloads
    return {call_id: payloads[call_id] for call_id in wanted if call_id in payloads}
