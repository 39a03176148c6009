"""Which ``chat_template_kwargs`` a client may have the engine's chat template see.

vLLM hands ``chat_template_kwargs`` to the tokenizer's ``apply_chat_template``, where keys such as
``chat_template`` replace the model's template with the client's own Jinja (GHSA-6fvq-23cw-5628) and others
(``tokenize``, ``tools``, ...) change how the prompt is built behind the proxy's back. The harness is untrusted, so
only the template switches the operator lists (``POLAR_CHAT_TEMPLATE_KWARGS``; by default the reasoning switches
of Qwen3 / GLM ``enable_thinking``, DeepSeek-V3.1 ``thinking`` and gpt-oss ``reasoning_effort``), with plain
values, go through. Anything else is refused with the protocol's 400 rather than dropped: a harness that asked for
a switch should learn it was not applied, not get a prompt it did not ask for in silence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polar.errors import ValidationError

SETTING = "POLAR_CHAT_TEMPLATE_KWARGS"
FIELD = "chat_template_kwargs"
# Arguments of apply_chat_template itself, not variables of a template: never a client's to set.
RESERVED = frozenset(
    {
        "chat_template", "tokenize", "return_dict", "return_tensors", "return_assistant_tokens_mask",
        "tokenizer_kwargs", "tools", "documents", "conversation", "messages", "add_generation_prompt",
        "continue_final_message", "padding", "truncation", "max_length",
    }
)  # fmt: skip
# Engine-body fields that bring a client's template or processor code paths; no protocol forwards them.
_NEVER_FORWARDED = ("chat_template", "mm_processor_kwargs")


def check_setting(allowed: Sequence[str]) -> None:
    """Refuse a ``POLAR_CHAT_TEMPLATE_KWARGS`` that lists a reserved name (at start-up)."""
    for name in allowed:
        if name in RESERVED or not name.isidentifier():
            raise ValidationError(f"{SETTING}: {name!r} cannot be allowed (not a template switch)", field=SETTING)


def check_template_kwargs(engine_body: Mapping[str, Any], allowed: Sequence[str]) -> None:
    """Refuse an engine body whose ``chat_template_kwargs`` hold a key outside ``allowed`` or a value that is not
    a string, number, boolean or null."""
    for name in _NEVER_FORWARDED:
        if name in engine_body:
            raise ValidationError(f"{name}: not accepted by this proxy", field=name)
    kwargs = engine_body.get(FIELD)
    if kwargs is None:
        return
    if not isinstance(kwargs, Mapping):
        raise ValidationError(f"{FIELD}: must be an object", field=FIELD)
    for key, value in kwargs.items():
        if key not in allowed or key in RESERVED:
            listed = ", ".join(allowed) or "none"
            raise ValidationError(
                f"{FIELD}.{key}: not allowed; this deployment passes only these keys to the chat template: {listed} "
                f"(the operator sets them with {SETTING})",
                field=f"{FIELD}.{key}",
            )
        if value is not None and not isinstance(value, bool | int | float | str):
            raise ValidationError(f"{FIELD}.{key}: must be a string, number, boolean or null", field=f"{FIELD}.{key}")
