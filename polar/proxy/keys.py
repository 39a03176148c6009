"""Session proxy keys: random secrets (192 bits) minted at run start; only their sha256 is stored."""

from __future__ import annotations

import hashlib
import secrets


def mint_key() -> str:
    return "pk-" + secrets.token_urlsafe(24)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()
