"""The reference engine's tokenizer: byte-level BPE trained deterministically from the shipped corpus.

Byte-level pre-tokenisation and decoding mean any Unicode text round-trips exactly. The ChatML and markup
tokens are added tokens, so they are recognised in text and never split; the three ChatML control tokens are
"special" (dropped by `skip_special_tokens`), while the `<think>`/`<tool_call>` markup is not, as in Qwen.

The image placeholder `<image>` is NOT in the vocabulary (its text ids stay those of a text-only model): it is
`IMAGE_TOKEN_ID`, one past the last id (`polar.chat.images`), which `encode_images` splices in where a prompt that
came with images holds the placeholder, and which decodes to `<image>` where a caller allows it (`images=True`).

    tok = load_tokenizer()
    ids = tok.encode("<|im_start|>user\\nhi<|im_end|>")
    assert tok.decode(ids) == "<|im_start|>user\\nhi<|im_end|>"
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import deque
from collections.abc import Sequence
from importlib import resources

from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as _HFTokenizer

from polar.chat.errors import EngineRequestError
from polar.chat.images import IMAGE_TOKEN, IMAGE_TOKEN_ID

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"

CONTROL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
MARKUP_TOKENS = (
    THINK_START,
    THINK_END,
    TOOL_CALL_START,
    TOOL_CALL_END,
    TOOL_RESPONSE_START,
    TOOL_RESPONSE_END,
)
VOCAB_SIZE = 8192
_ENCODE_CACHE_SIZE = 4096
_DECODED_PROMPTS = 32  # recent token prompts kept as bytes (one per agent in flight is what pays)


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes-to-unicode table that the ByteLevel pre-tokenizer uses."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    codes = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


class Tokenizer:
    """A trained byte-level BPE tokenizer with ChatML special tokens (immutable after construction)."""

    def __init__(self, backend: _HFTokenizer) -> None:
        self._backend = backend
        self._vocab_size = backend.get_vocab_size(with_added_tokens=True)
        byte_of = _byte_decoder()
        table: list[bytes] = []
        self._special_ids = frozenset(backend.token_to_id(t) or 0 for t in CONTROL_TOKENS)
        added = set(CONTROL_TOKENS + MARKUP_TOKENS)
        for token_id in range(self._vocab_size):
            token = backend.id_to_token(token_id) or ""
            if token in added:
                table.append(token.encode("utf-8"))
            else:
                table.append(bytes(byte_of[ch] for ch in token))
        tokens = [backend.id_to_token(i) or "" for i in range(self._vocab_size)]
        if self._vocab_size == IMAGE_TOKEN_ID:  # the image id follows the vocabulary (one of another size has none)
            table.append(IMAGE_TOKEN.encode("utf-8"))
            tokens.append(IMAGE_TOKEN)
        self._bytes = tuple(table)
        self._tokens = tuple(tokens)
        self._eos_token_id = self.token_to_id(IM_END)
        self._encode_cached = functools.lru_cache(maxsize=_ENCODE_CACHE_SIZE)(self._encode_uncached)
        self._prompts = _DecodedPrompts(_DECODED_PROMPTS)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._vocab_size

    @property
    def eos_token_id(self) -> int:
        """Id of `<|im_end|>`, the end-of-turn token generation stops on."""
        return self._eos_token_id

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids dropped by `skip_special_tokens` (the ChatML control tokens)."""
        return self._special_ids

    def to_json(self) -> str:
        """The tokenizer in the Hugging Face `tokenizer.json` format."""
        return self._backend.to_str()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special and markup tokens written in the text become single ids."""
        return list(self._encode_cached(text))

    def _encode_uncached(self, text: str) -> tuple[int, ...]:
        return tuple(self._backend.encode(text, add_special_tokens=False).ids)

    def encode_images(self, text: str, images: int) -> list[int]:
        """Token ids of a prompt that came with ``images`` images: each `<image>` in ``text`` is the one id
        ``IMAGE_TOKEN_ID`` and the text between is encoded as ``encode`` would (an added token in a VLM's
        tokenizer splits the text the same way). EngineRequestError when the placeholders are not one per image."""
        pieces = text.split(IMAGE_TOKEN)
        if len(pieces) - 1 != images:
            raise EngineRequestError(
                f"The prompt holds {len(pieces) - 1} {IMAGE_TOKEN} placeholders for {images} images: "
                f"a message's text must not write {IMAGE_TOKEN} itself",
                param="messages",
            )
        ids = self.encode(pieces[0])
        for piece in pieces[1:]:
            ids.append(IMAGE_TOKEN_ID)
            ids += self._encode_cached(piece)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False, images: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 (a sequence cut inside a character) decodes to U+FFFD. ``images``: the
        image id is allowed and decodes to `<image>`."""
        self._check_ids(ids, images)
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        return b"".join(map(self._bytes.__getitem__, ids)).decode("utf-8", errors="replace")

    def decode_prompt(self, ids: Sequence[int], images: bool = False) -> str:
        """``decode(ids)`` for a token prompt: an agent's next prompt extends its last one, so only the ids after
        the longest recently decoded prefix are checked and joined (the rest is the bytes kept from then)."""
        ids = tuple(ids)
        known, data = self._prompts.longest_prefix(ids)
        tail = ids[known:]
        self._check_ids(tail, images)
        if tail:  # a prompt kept whole already is not kept twice
            data += b"".join(map(self._bytes.__getitem__, tail))
            self._prompts.add(ids, data)
        return data.decode("utf-8", errors="replace")

    def check_ids(self, ids: Sequence[int]) -> None:
        """Raise EngineRequestError unless every id is an int inside the vocabulary (checked in C-level passes; the
        loop only names the first bad id)."""
        self._check(ids, self._vocab_size)

    def _check_ids(self, ids: Sequence[int], images: bool) -> None:
        if images:
            self._check(ids, len(self._bytes))  # the image id too
        else:
            self.check_ids(ids)

    def _check(self, ids: Sequence[int], end: int) -> None:
        if not ids or (set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < end):
            return
        for token_id in ids:
            if not isinstance(token_id, int) or isinstance(token_id, bool) or not 0 <= token_id < end:
                raise EngineRequestError(f"Token id {token_id!r} is out of vocabulary (size {self._vocab_size})")

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary string of `token_id` (byte-level form, e.g. 'Ġhello'; `<image>` for the image id)."""
        return self._tokens[token_id]

    def token_to_id(self, token: str) -> int:
        """Id of a vocabulary string; KeyError when absent."""
        token_id = self._backend.token_to_id(token)
        if token_id is None:
            raise KeyError(token)
        return token_id

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes `token_id` contributes to decoded text (possibly part of one character)."""
        return self._bytes[token_id]

    def is_special(self, token_id: int) -> bool:
        """Whether `skip_special_tokens` drops this id."""
        return token_id in self._special_ids


def corpus_text() -> str:
    """The training corpus shipped with the package."""
    return resources.files("polar.chat").joinpath("data/corpus.txt").read_text(encoding="utf-8")


def corpus_digest() -> str:
    """SHA-256 of the corpus, which (with VOCAB_SIZE) identifies the trained vocabulary."""
    return hashlib.sha256(corpus_text().encode("utf-8")).hexdigest()


def train_tokenizer(corpus: str, vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Train a fresh tokenizer on `corpus`; the same corpus always yields the same vocabulary."""
    backend = _HFTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(MARKUP_TOKENS),
        min_frequency=1,
        show_progress=False,
        special_tokens=list(CONTROL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return Tokenizer(backend)


@functools.lru_cache(maxsize=1)
def load_tokenizer() -> Tokenizer:
    """The engine's tokenizer, trained once per process from the shipped corpus."""
    return train_tokenizer(corpus_text())


class _DecodedPrompts:
    """The bytes of the last few token prompts decoded, most recent last, shared by the engine's threads."""

    def __init__(self, size: int) -> None:
        self._entries: deque[tuple[tuple[int, ...], bytes]] = deque(maxlen=size)  # the oldest drops out
        self._lock = threading.Lock()

    def longest_prefix(self, ids: tuple[int, ...]) -> tuple[int, bytes]:
        """How many leading ids of ``ids`` a kept prompt covers, and that prompt's bytes (0 and b"" if none)."""
        with self._lock:
            entries = list(self._entries)
        # Longest first, stopping at the first that fits: a session's earlier prompts are all prefixes of its next
        # one, and comparing each in full cost a TITO call at 40k ids ~15 whole comparisons.
        for kept, data in sorted(entries, key=lambda entry: len(entry[0]), reverse=True):
            if _starts_with(ids, kept):
                return len(kept), data
        return 0, b""

    def add(self, ids: tuple[int, ...], data: bytes) -> None:
        with self._lock:
            self._entries.append((ids, data))


def _starts_with(ids: tuple[int, ...], kept: tuple[int, ...]) -> bool:
    """Whether ``ids`` begins with ``kept``. Its last 64 ids and every 512th are compared first: the whole comparison
    copies the ids, and a kept prompt that differs (another agent's, or the conversation rendered afresh) mostly
    differs there."""
    n = len(kept)
    return n <= len(ids) and kept[-64:] == ids[max(0, n - 64) : n] and kept[::512] == ids[:n:512] and ids[:n] == kept
