from __future__ import annotations

import pytest

from polar.chat.conversation import Message
from polar.chat.tokenizer import Tokenizer
from polar.refengine.policies import EchoPolicy, PolicyRequest


def test_echoes_the_last_user_message() -> None:
    request = PolicyRequest(messages=(Message("user", "first"), Message("assistant", "x"), Message("user", "last")))
    assert EchoPolicy({}).respond(request).content == "last"


def test_fixed_text() -> None:
    assert EchoPolicy({"text": "Hi."}).respond(PolicyRequest(messages=())).content == "Hi."


@pytest.mark.parametrize("tokens", [1, 2, 17, 300])
def test_token_count(tok: Tokenizer, tokens: int) -> None:
    content = EchoPolicy({"tokens": tokens}).respond(PolicyRequest(messages=())).content
    assert len(tok.encode(content)) == tokens


@pytest.mark.parametrize("config", [{"tokens": 0}, {"tokens": "5"}, {"text": 3}])
def test_bad_config(config: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        EchoPolicy(config)
