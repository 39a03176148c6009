"""Session proxy keys: random secrets (192 bits) minted at run start; only their sha256 is stored."""

from __future__ import annotations

import secrets

from polar.contract.proxy_routes import hash_key

__all__ = ["hash_key", "mint_key"]


def mint_key() -> str:
    return "pk-" + secrets.token_urlsafe(24)
