"""Who may call the rollout API. The API runs commands on the workers, so it never runs open:

- ``POLAR_API_TOKEN`` (required; the app refuses to be created without it) is the submit/admin token: everything.
- ``POLAR_API_READ_TOKEN`` (optional) is read-only, for trainers and viewers: the safe methods (GET, HEAD,
  OPTIONS), i.e. batches, sessions, calls, trajectories, the feed, exports and the engine's state. Every other
  method starts or changes work (submit, cancel, engine pause/resume) and gets 403, so a route added later is
  admin-only unless it is a GET.
- ``/healthz`` answers without a token: load balancers probe it, and it tells only whether the database answers.
- A blueprint registered with :func:`authenticates_itself` checks its own requests with :func:`token_role`: the
  web console (``web.console``) takes the same tokens, or the signed session cookie a browser gets by logging in
  with one.

A missing or wrong token is 401. Each request that passes carries a ``polar.records.audit.Caller``
(:func:`caller`) for the views' audit rows; a read-only token refused with 403 leaves a ``denied`` row (a 401
leaves only a log line, so anyone who can reach the port cannot fill the table).
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass

from flask import Flask, current_app, g, request

from polar.config import Config
from polar.errors import Forbidden, Unauthorized, ValidationError
from polar.records.audit import Caller, actor, record_now
from web.api.requests import services

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz"})
SELF_AUTHENTICATING = "polar.self_authenticating"  # app.extensions key: names of blueprints that check callers
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MIN_TOKEN_CHARS = 32
GENERATE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
ADMIN, READ = "admin", "read"


@dataclass(frozen=True)
class Tokens:
    admin: str
    read: str | None


def check_tokens(config: Config) -> Tokens:
    """The tokens of ``config``, or a ValidationError saying how to set them: the admin token is required, both
    must be at least ``MIN_TOKEN_CHARS`` long, and they must differ."""
    admin = (config.api_token or "").strip()
    if not admin:
        raise ValidationError(
            "POLAR_API_TOKEN is not set: the rollout API never starts without a token. "
            f"Generate one with  {GENERATE}  and set POLAR_API_TOKEN to it (clients send "
            "'Authorization: Bearer <token>'; POLAR_API_READ_TOKEN optionally adds a read-only token)",
            field="POLAR_API_TOKEN",
        )
    read = (config.api_read_token or "").strip() or None
    for name, token in (("POLAR_API_TOKEN", admin), ("POLAR_API_READ_TOKEN", read)):
        if token is not None and len(token) < MIN_TOKEN_CHARS:
            raise ValidationError(
                f"{name} must be at least {MIN_TOKEN_CHARS} characters (a random secret); generate one with  "
                f"{GENERATE}",
                field=name,
            )
    if read is not None and hmac.compare_digest(read.encode(), admin.encode()):
        raise ValidationError(
            f"POLAR_API_READ_TOKEN must differ from POLAR_API_TOKEN (generate another with  {GENERATE}  )",
            field="POLAR_API_READ_TOKEN",
        )
    return Tokens(admin, read)


def require_tokens(app: Flask, config: Config) -> None:
    """Check ``config``'s tokens (raising when the API would run open) and authenticate every request."""
    app.extensions["polar.tokens"] = check_tokens(config)
    app.before_request(_authenticate)


def authenticates_itself(app: Flask, blueprint: str) -> None:
    """Leave the requests of ``blueprint`` to its own check (which must use :func:`token_role`)."""
    app.extensions.setdefault(SELF_AUTHENTICATING, set()).add(blueprint)


def app_tokens(app: Flask) -> Tokens:
    """The tokens ``app`` was created with (checked by :func:`require_tokens`)."""
    return app.extensions["polar.tokens"]  # type: ignore[no-any-return]


def token_role(supplied: str) -> str | None:
    """``ADMIN`` or ``READ`` for a token of the current app, None for any other string (compared in constant
    time)."""
    return _role(app_tokens(current_app), supplied.strip()) if supplied.strip() else None


def bearer_token() -> str | None:
    """The token of the request's ``Authorization: Bearer <token>`` header (stripped), or None without one."""
    scheme, _, supplied = request.headers.get("Authorization", "").partition(" ")
    return supplied.strip() if scheme.lower() == "bearer" else None


def caller() -> Caller:
    """The authenticated caller of the current request."""
    return g.polar_caller  # type: ignore[no-any-return]


def _role(tokens: Tokens, supplied: str) -> str | None:
    given = supplied.encode()
    is_admin = hmac.compare_digest(given, tokens.admin.encode())
    is_read = tokens.read is not None and hmac.compare_digest(given, tokens.read.encode())
    return ADMIN if is_admin else READ if is_read else None


def _authenticate() -> None:
    if request.path in OPEN_PATHS or request.blueprint in current_app.extensions.get(SELF_AUTHENTICATING, ()):
        return
    supplied = bearer_token() or ""
    role = _role(current_app.extensions["polar.tokens"], supplied) if supplied else None
    if role is None:
        log.warning("401 %s %s from %s: missing or wrong token", request.method, request.path, request.remote_addr)
        raise Unauthorized("missing or wrong bearer token (Authorization: Bearer <POLAR_API_TOKEN>)")
    g.polar_caller = Caller(actor(role, supplied), request.remote_addr)
    if role == READ and request.method not in READ_METHODS:
        path = request.path.replace("\x00", "\\x00")  # %00 decodes to a NUL, which Postgres text cannot hold
        detail = {"method": request.method, "path": path}
        record_now(services().db, caller(), "denied", path, detail)
        raise Forbidden(
            f"this token is read-only (POLAR_API_READ_TOKEN): it may read, not {request.method} {request.path}; "
            "submitting, cancelling and pausing or resuming the engine need the admin token (POLAR_API_TOKEN)"
        )
