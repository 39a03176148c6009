from __future__ import annotations

import pytest

from polar.codec.redaction import shown_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:pw@host:8000/v1?api_key=x#f", "http://host:8000/v1"),
        ("https://token@trainer.example/hook?sig=abc", "https://trainer.example/hook"),
        ("http://[::1]:9/x", "http://[::1]:9/x"),
        ("http://plain/", "http://plain/"),
        ("http://[broken", "<unparseable URL>"),
    ],
)
def test_secrets_are_left_out(url: str, shown: str) -> None:
    assert shown_url(url) == shown
