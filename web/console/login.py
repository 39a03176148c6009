"""Who may open the console: whoever holds one of the API's tokens (``web.api.auth``; the read-only one is
enough, the console only reads).

A request passes with ``Authorization: Bearer <token>`` (scripts, curl), or with the session cookie a browser
gets from the login form at ``/ui/login``. The cookie is signed with a key derived from the tokens, so every
gunicorn worker accepts it, and rotating a token signs every browser out; it records the token's role and
fingerprint, never the token. Anything else is sent to the login form.

CSRF: the login form is the console's only POST, and it carries a per-session token; the cookie is
``SameSite=Lax`` and ``HttpOnly``. Logging out is a GET that only clears the cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from datetime import timedelta

from flask import Flask, Response, g, redirect, render_template, request, session, url_for

from polar.errors import Unauthorized
from polar.records.audit import Caller, actor
from web.api.auth import Tokens, bearer_token, token_role
from web.console.blueprint import blueprint

log = logging.getLogger(__name__)

SESSION_LIFETIME = timedelta(hours=12)
COOKIE_NAME = "polar_console"
_OPEN_ENDPOINTS = frozenset({"console.login", "console.static"})


def session_secret(tokens: Tokens) -> bytes:
    """The cookie-signing key: the same in every process that has the same tokens, and new when one changes."""
    material = "\0".join((tokens.admin, tokens.read or "")).encode()
    return hmac.new(material, b"polar console session v1", hashlib.sha256).digest()


def _next_page(value: str | None) -> str:
    # Only back into the console: never an absolute URL (an open redirect) or a scheme-relative one.
    if value and value.startswith("/ui/") and not value.startswith("//") and "\\" not in value:
        return value
    return url_for("console.batches")


@blueprint.before_request
def _authenticate() -> Response | None:
    if request.endpoint in _OPEN_ENDPOINTS:
        return None
    supplied = bearer_token()
    if supplied is not None:
        role = token_role(supplied)
        if role is None:
            log.warning("401 %s %s from %s: wrong token", request.method, request.path, request.remote_addr)
            raise Unauthorized("wrong bearer token (Authorization: Bearer <POLAR_API_TOKEN or POLAR_API_READ_TOKEN>)")
        g.polar_caller = Caller(actor(role, supplied), request.remote_addr)
        return None
    signed_in = session.get("actor")
    if isinstance(signed_in, str):
        g.polar_caller = Caller(signed_in, request.remote_addr)
        return None
    target = request.full_path if request.query_string else request.path
    return redirect(url_for("console.login", next=target))  # type: ignore[return-value]


@blueprint.route("/login", methods=["GET", "POST"])
def login() -> Response | tuple[str, int] | str:
    if request.method == "GET":
        csrf = session.setdefault("csrf", secrets.token_urlsafe(24))
        return render_template("console/login.html", csrf=csrf, next=_next_page(request.args.get("next")))
    expected = session.get("csrf")
    target = _next_page(request.form.get("next"))
    if not isinstance(expected, str) or not hmac.compare_digest(request.form.get("csrf", ""), expected):
        session["csrf"] = csrf = secrets.token_urlsafe(24)
        message = "The form expired; please sign in again."
        return render_template("console/login.html", csrf=csrf, next=target, error=message), 400
    supplied = request.form.get("token", "")
    role = token_role(supplied)
    if role is None:
        log.warning("console login refused from %s: wrong token", request.remote_addr)
        message = "That is not one of this API's tokens (POLAR_API_TOKEN or POLAR_API_READ_TOKEN)."
        return render_template("console/login.html", csrf=expected, next=target, error=message), 401
    session.clear()  # a fresh session: nothing from before the login survives it
    session.permanent = True
    session["actor"] = actor(role, supplied.strip())
    log.info("console login as %s from %s", session["actor"], request.remote_addr)
    return redirect(target)  # type: ignore[return-value]


@blueprint.get("/logout")
def logout() -> Response:
    session.clear()
    return redirect(url_for("console.login"))  # type: ignore[return-value]


def configure_sessions(app: Flask, tokens: Tokens) -> None:
    """Sign ``app``'s session cookie with ``session_secret(tokens)``; the cookie goes to console pages only."""
    app.config.update(
        SECRET_KEY=session_secret(tokens),
        SESSION_COOKIE_NAME=COOKIE_NAME,
        SESSION_COOKIE_PATH=blueprint.url_prefix,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME,
    )
