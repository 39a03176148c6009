"""Prompts stored as deltas, so a session's storage grows linearly with its tokens (DESIGN.md §7).

An agent's next prompt usually repeats its previous prompt and completion and adds a few turns. A call stores
only what comes after ``prompt_prefix_len`` leading tokens taken from its parent (``prompt_parent_id``: an
earlier successful call of the same session), whose full prompt + completion it extends:

    full prompt = (parent's full prompt + parent's completion)[:prompt_prefix_len] + stored prompt_token_ids

    delta = encode_prompt(prompt, completion, candidates)   # capture: pick the parent, cut the prompt
    prompts = full_prompts(rows)                            # readers: {call id: full prompt}, in one pass

Parents are found by ``chain_hash``, the sha256 of a call's full prompt + completion: the longest earlier chain
whose hash equals the hash of the new prompt's first that-many tokens. In SQL, ``polar_full_prompt(id)`` and
the view ``model_calls_full`` rebuild the same arrays (migration 0004).
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import uuid
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload

from polar.errors import PolarError


class StoredPrompt(Protocol):
    """What ``full_prompts`` reads of a ``model_calls`` row (an ORM object or a Core row)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def prompt_parent_id(self) -> uuid.UUID | None: ...
    @property
    def prompt_prefix_len(self) -> int: ...
    @property
    def prompt_token_ids(self) -> Sequence[int]: ...
    @property
    def completion_token_ids(self) -> Sequence[int]: ...


@dataclass(frozen=True)
class Chain:
    """An earlier call that may become a parent: its full prompt + completion's length and hash."""

    call_id: uuid.UUID
    length: int
    chain_hash: str


@dataclass(frozen=True)
class PromptDelta:
    """How to store a call's prompt: ``token_ids`` after ``prefix_len`` tokens taken from ``parent_id``."""

    parent_id: uuid.UUID | None
    prefix_len: int
    token_ids: list[int]
    prompt_len: int
    chain_hash: str


class TokenIds(list[int]):
    """Token ids already known to be plain ints in int32 range, with their little-endian int32 bytes
    (``polar.proxy.prompt_ids`` reads an engine's answer so): neither is worked out again for them. Never changed
    in place once handed out (a changed copy is a plain list); ``KnownPrompts`` grows one only while nothing else
    holds it. ``digest``: the sha256 of its first ``n`` ids, as ``(n, hash)``, when ``encode_prompt`` has hashed
    them (growing at the end leaves it true)."""

    __slots__ = ("digest", "int32")

    def __init__(self, ids: Iterable[int], int32: bytes, digest: tuple[int, Any] | None = None) -> None:
        super().__init__(ids)
        self.int32 = int32
        self.digest = digest


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    """The ids as little-endian int32, so a hash means the same on every machine (``struct`` packs a list in one
    call, ~1.5x faster than building an ``array`` from it)."""
    if type(token_ids) is TokenIds:
        return token_ids.int32
    return struct.pack(f"<{len(token_ids)}i", *token_ids)


def chain_hash(token_ids: Sequence[int]) -> str:
    """The sha256 (hex) a call stores for its full prompt + completion."""
    return hashlib.sha256(_token_bytes(token_ids)).hexdigest()


def encode_prompt(prompt: Sequence[int], completion: Sequence[int], chains: Iterable[Chain]) -> PromptDelta:
    """Pick the parent for ``prompt`` among the session's earlier ``chains`` (oldest first) and cut the prompt.

    The prompt is hashed once, incrementally: each candidate length costs a digest, not a pass over the prompt. A
    ``TokenIds`` prompt that grew from the last one hashed (an agent's next turn) is hashed only past it: the
    candidates it reaches are tried longest first from there, and the prompt's own digest is kept on it for the
    next turn (at 40k ids: 0.10 -> 0.01 ms here, warm).
    """
    by_length: dict[int, list[Chain]] = {}
    size = len(prompt)
    for chain in chains:
        if 0 < chain.length <= size:
            by_length.setdefault(chain.length, []).append(chain)
    data = memoryview(_token_bytes(prompt))
    known = prompt.digest if type(prompt) is TokenIds else None
    if known is None or known[0] > size:
        parent, hashed, digest = _longest_match(data, by_length, size + 1)
    else:
        (hashed, digest), parent = known, None
        for length in sorted((length for length in by_length if length >= hashed), reverse=True):
            tried = digest.copy()
            tried.update(data[hashed * 4 : length * 4])
            if (parent := _latest_match(by_length[length], tried.hexdigest())) is not None:
                break
        if parent is None:  # none of those: the shorter candidates, hashed from the start
            parent = _longest_match(data, by_length, hashed)[0]
    digest = digest.copy()
    digest.update(data[hashed * 4 :])
    if type(prompt) is TokenIds:
        prompt.digest = (size, digest.copy())
    digest.update(_token_bytes(completion))
    prefix_len = parent.length if parent else 0
    return PromptDelta(
        parent_id=parent.call_id if parent else None,
        prefix_len=prefix_len,
        token_ids=list(prompt[prefix_len:]),
        prompt_len=size,
        chain_hash=digest.hexdigest(),
    )


def _latest_match(chains: list[Chain], prefix_hash: str) -> Chain | None:
    """Among equal-length chains (a retried call), the latest whose hash is ``prefix_hash``."""
    return next((chain for chain in reversed(chains) if chain.chain_hash == prefix_hash), None)


def _longest_match(data: memoryview, by_length: dict[int, list[Chain]], below: int) -> tuple[Chain | None, int, Any]:
    """The longest chain shorter than ``below`` ids that ``data`` begins with, hashing ``data`` once from its start;
    with how many ids that hashed, and the hash so far."""
    digest, hashed, parent = hashlib.sha256(), 0, None
    for length in sorted(length for length in by_length if length < below):
        digest.update(data[hashed * 4 : length * 4])
        hashed = length
        parent = _latest_match(by_length[length], digest.hexdigest()) or parent
    return parent, hashed, digest


def full_prompts(
    rows: Iterable[StoredPrompt], wanted: Collection[uuid.UUID] | None = None
) -> dict[uuid.UUID, list[int]]:
    """The full prompts of ``wanted`` rows (default: every row), by call id. ``rows`` come in ``seq`` order and
    include each wanted row's ancestors (parents are successful calls of the same session, so a session's
    successful calls up to the last one wanted always suffice).

    Prompts are built as lists of slices of the stored arrays and only the wanted ones are joined: a page of a
    200-call session costs its own tokens, not every earlier prompt's.
    """
    # Each call's full prompt + completion, as slices, and its length.
    chains: dict[uuid.UUID, tuple[list[tuple[Sequence[int], int, int]], int]] = {}
    prompts: dict[uuid.UUID, list[int]] = {}
    for row in rows:
        stored = row.prompt_token_ids
        if row.prompt_parent_id is None:
            head: list[tuple[Sequence[int], int, int]] = []
        elif row.prompt_parent_id not in chains:
            raise PolarError(f"call {row.id}: its prompt's parent {row.prompt_parent_id} was not loaded first")
        else:
            parent, length = chains[row.prompt_parent_id]
            # Nearly always the whole parent chain: no walk over its slices.
            head = parent if row.prompt_prefix_len == length else _cut(parent, row.prompt_prefix_len)
        prompt = [*head, (stored, 0, len(stored))] if len(stored) else head
        if wanted is None or row.id in wanted:
            prompts[row.id] = _joined(prompt)
        completion = row.completion_token_ids
        chain = [*prompt, (completion, 0, len(completion))] if len(completion) else prompt
        chains[row.id] = (chain, row.prompt_prefix_len + len(stored) + len(completion))
    return prompts


def _joined(segments: list[tuple[Sequence[int], int, int]]) -> list[int]:
    joined: list[int] = []
    for tokens, start, end in segments:
        joined.extend(tokens[start:end])
    return joined


def _cut(segments: list[tuple[Sequence[int], int, int]], length: int) -> list[tuple[Sequence[int], int, int]]:
    """The first ``length`` tokens of a sliced sequence, still as slices."""
    kept, total = [], 0
    for tokens, start, end in segments:
        if total >= length:
            break
        take = min(end - start, length - total)
        kept.append((tokens, start, start + take))
        total += take
    return kept


class PromptView(Sequence[int]):
    """A full prompt (or prompt + completion) read through its deltas, never joined: the first ``take`` ids of
    ``parent``, then ``own`` (a row's stored ids). A session's views share their ancestors, so all of them together
    cost the session's stored ids once, where joined prompts cost the sum of every prompt's length (audit F19: 200
    calls of 40k tokens). Iterating, ``len``, indexing and comparing with a list work as on the joined list;
    ``list(view)`` joins it when a caller needs one."""

    __slots__ = ("_length", "_own", "_parent", "_take")

    def __init__(self, parent: PromptView | None, take: int, own: Sequence[int]) -> None:
        self._parent, self._take, self._own = parent, take, own
        self._length = take + len(own)

    def __len__(self) -> int:
        return self._length

    def _pieces(self) -> list[tuple[Sequence[int], int]]:
        """``(ids, how many of their first ids)`` from the first piece to the last (a loop: a 1,000-call chain
        is 1,000 levels deep)."""
        pieces: list[tuple[Sequence[int], int]] = []
        node: PromptView | None = self
        wanted = self._length
        while node is not None and wanted > 0:
            if wanted > node._take:
                pieces.append((node._own, wanted - node._take))
                wanted = node._take
            node = node._parent
        pieces.reverse()
        return pieces

    def __iter__(self) -> Iterator[int]:
        # Chained in C: ``list(view)`` of a 200-call session's prompts is millions of ids, and a generator that
        # yields each one cost postrun ~0.5 s there.
        return itertools.chain.from_iterable(itertools.islice(ids, count) for ids, count in self._pieces())

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return list(self)[index]
        position = index + self._length if index < 0 else index
        if not 0 <= position < self._length:
            raise IndexError("prompt index out of range")
        for ids, count in self._pieces():
            if position < count:
                return ids[position]
            position -= count
        raise IndexError("prompt index out of range")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PromptView | list | tuple):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PromptView({list(self)!r})"


def prompt_views(rows: Iterable[StoredPrompt]) -> dict[uuid.UUID, PromptView]:
    """Every row's full prompt as a ``PromptView`` (``full_prompts``' rules: rows in ``seq`` order, ancestors
    first), by call id."""
    chains: dict[uuid.UUID, PromptView] = {}
    prompts: dict[uuid.UUID, PromptView] = {}
    for row in rows:
        parent: Any = None
        if row.prompt_parent_id is not None:
            parent = chains.get(row.prompt_parent_id)
            if parent is None:
                raise PolarError(f"call {row.id}: its prompt's parent {row.prompt_parent_id} was not loaded first")
        prompt = PromptView(parent, row.prompt_prefix_len if parent is not None else 0, row.prompt_token_ids)
        prompts[row.id] = prompt
        chains[row.id] = PromptView(prompt, len(prompt), row.completion_token_ids)
    return prompts
