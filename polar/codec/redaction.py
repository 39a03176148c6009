"""Showing URLs in messages and logs without the secrets they may carry (``user:password@``, ``?api_key=``):
engine URLs end up in the error bodies harnesses receive, callback URLs in worker logs."""

from __future__ import annotations

from urllib.parse import urlsplit


def shown_url(url: str) -> str:
    """``url`` without user info, query or fragment."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    return parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment="").geturl()
