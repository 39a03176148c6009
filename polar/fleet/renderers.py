"""Rendering a chat request to prompt token ids on the proxy, for engines whose API takes token ids only
(SGLang's native ``/generate``; ``polar.fleet.backends.sglang``).

    renderer = ChatRenderer.load("/models/Qwen3-8B")            # the model's tokenizer directory
    ids = renderer.prompt_ids({"messages": [...], "tools": [...], "chat_template_kwargs": {...}})

It uses ``transformers`` (``AutoTokenizer.apply_chat_template``) with the directory's own chat template, and
hands the template messages the way vLLM does (``vllm/entrypoints/chat_utils.py``), so a model behind SGLang sees
the prompt it would see behind vLLM: text content parts joined with newlines, ``developer`` as ``system``,
tool-call arguments parsed from their JSON string into objects, reasoning as ``reasoning_content``.

The proxy's threads share one renderer (audit F20: it rendered and tokenised every SGLang call under one
process-wide lock, so a 40k-token conversation held up every other session's call). The template renders with no
lock (Jinja reads the tokenizer's settings, never changes them); encoding takes one of ``TOKENIZERS`` copies of the
tokenizer, each used by one thread at a time (a fast tokenizer's Rust object refuses to be borrowed by two threads
mid-call), so that many calls encode at once and memory stays bounded.
"""

from __future__ import annotations

import copy
import json
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from polar.errors import ValidationError


def template_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Messages as a chat template receives them (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for index, raw in enumerate(messages):
        if not isinstance(raw, Mapping):
            raise ValidationError(f"messages[{index}] must be an object", field="messages")
        message = copy.deepcopy(dict(raw))
        if message.get("role") == "developer":
            message["role"] = "system"
        content = message.get("content")
        if isinstance(content, list):
            texts = [part if isinstance(part, str) else part.get("text") for part in content]
            if not all(isinstance(text, str) for text in texts):
                raise ValidationError(f"messages[{index}].content: only text parts can be rendered", field="messages")
            message["content"] = "\n".join(texts)  # type: ignore[arg-type]
        reasoning = message.pop("reasoning", None)
        if isinstance(reasoning, str) and not isinstance(message.get("reasoning_content"), str):
            message["reasoning_content"] = reasoning
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                try:
                    function["arguments"] = json.loads(function["arguments"] or "{}")
                except (json.JSONDecodeError, RecursionError):
                    pass  # kept verbatim, as vLLM keeps arguments that are not JSON
        out.append(message)
    return out


# Copies of the tokenizer one process encodes with at once (each a few MB to tens of MB).
TOKENIZERS = min(8, os.cpu_count() or 1)


class ChatRenderer:
    """A tokenizer directory's chat template and tokenizer (thread-safe; load once per process)."""

    def __init__(
        self, tokenizer: Any, source: str, copies: int = TOKENIZERS, clone: Callable[[Any], Any] = copy.deepcopy
    ) -> None:
        # This one renders templates and is copied, never encoded with: only ever read, by any thread.
        self._tokenizer = tokenizer
        self.source = source
        # Copies are made when first needed: a proxy that serves one call at a time makes one.
        self._idle: queue.LifoQueue[Any] = queue.LifoQueue()
        self._unmade = copies
        self._clone = clone
        self._counting = threading.Lock()

    @contextmanager
    def _encoder(self) -> Iterator[Any]:
        """A tokenizer no other thread is using, for the ``with`` block."""
        try:
            tokenizer = self._idle.get_nowait()
        except queue.Empty:
            tokenizer = self._new_copy() or self._idle.get()
        try:
            yield tokenizer
        finally:
            self._idle.put(tokenizer)

    def _new_copy(self) -> Any:
        """Another copy of the tokenizer, or None when all ``copies`` exist (the caller waits for an idle one)."""
        with self._counting:
            if self._unmade <= 0:
                return None
            self._unmade -= 1
        return self._clone(self._tokenizer)

    @classmethod
    def load(cls, directory: str, copies: int = TOKENIZERS) -> ChatRenderer:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise ValidationError(
                "rendering prompts for SGLang engines needs the transformers package (pip install 'polar[sglang]')",
                field="POLAR_ENGINE_TOKENIZER",
            ) from exc
        try:
            tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ValidationError(
                f"POLAR_ENGINE_TOKENIZER {directory!r} is not a tokenizer directory: {exc}",
                field="POLAR_ENGINE_TOKENIZER",
            ) from exc
        if not getattr(tokenizer, "chat_template", None):
            message = f"the tokenizer in {directory!r} has no chat template"
            raise ValidationError(message, field="POLAR_ENGINE_TOKENIZER")
        return cls(tokenizer, directory, copies)

    def prompt_text(self, chat_body: Mapping[str, Any]) -> str:
        """The rendered prompt of a chat request (``messages``, ``tools``, ``add_generation_prompt``,
        ``continue_final_message``, ``chat_template_kwargs``)."""
        add_generation_prompt = bool(chat_body.get("add_generation_prompt", True))
        continue_final = bool(chat_body.get("continue_final_message", False))
        if add_generation_prompt and continue_final:
            raise ValidationError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        kwargs = dict(chat_body.get("chat_template_kwargs") or {})
        try:  # no lock: rendering only reads the tokenizer's template and special tokens
            text = self._tokenizer.apply_chat_template(
                template_messages(chat_body.get("messages") or []),
                tools=chat_body.get("tools") or None,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final,
                tokenize=False,
                **kwargs,
            )
        except ValidationError:
            raise
        except Exception as exc:  # the template raised (raise_exception) or the messages do not fit it
            raise ValidationError(f"the chat template could not render these messages: {exc}") from exc
        return str(text)

    def prompt_ids(self, chat_body: Mapping[str, Any]) -> list[int]:
        """The prompt token ids of a chat request (the template writes any special tokens itself)."""
        return self.encode(self.prompt_text(chat_body))

    def encode(self, text: str) -> list[int]:
        with self._encoder() as tokenizer:
            return list(tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        with self._encoder() as tokenizer:
            return str(tokenizer.decode(list(ids), skip_special_tokens=False))
