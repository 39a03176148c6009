from __future__ import annotations

import pytest

from polar.errors import ValidationError
from polar.proxy.template_kwargs import check_setting, check_template_kwargs

ALLOWED = ("enable_thinking", "reasoning_effort")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"chat_template_kwargs": None},
        {"chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low"}},
        {"chat_template_kwargs": {"reasoning_effort": None}},
    ],
)
def test_allowed(body: dict[str, object]) -> None:
    check_template_kwargs(body, ALLOWED)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"chat_template_kwargs": {"chat_template": "{{ x }}"}}, "chat_template_kwargs.chat_template"),
        ({"chat_template_kwargs": {"thinking": True}}, "chat_template_kwargs.thinking"),
        ({"chat_template_kwargs": {"enable_thinking": [1]}}, "chat_template_kwargs.enable_thinking"),
        ({"chat_template_kwargs": []}, "chat_template_kwargs"),
        ({"chat_template": "{{ x }}"}, "chat_template"),
        ({"mm_processor_kwargs": {}}, "mm_processor_kwargs"),
    ],
)
def test_refused(body: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        check_template_kwargs(body, ALLOWED)
    assert refused.value.field == field and refused.value.message.startswith(f"{field}: ")


@pytest.mark.parametrize("name", ["chat_template", "tokenize", "tools", "not a name"])
def test_reserved_names_cannot_be_allowed(name: str) -> None:
    with pytest.raises(ValidationError, match="POLAR_CHAT_TEMPLATE_KWARGS"):
        check_setting(("enable_thinking", name))
