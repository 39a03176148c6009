"""Who may post rows to ``polar gym-agent``: the agent submits sessions that run commands, so it never runs open.

Two checks, in this order, on every route:

- **The peer's address** must be in the allow-list (403 otherwise). The default is loopback only
  (``DEFAULT_ALLOW_FROM``); ``--allow-from CIDR``, given once or more, replaces it, e.g. with the subnet of NeMo
  RL's nodes. This is the check NeMo RL can pass: NeMo Gym 0.7.0's client (and its ``legacy_agent`` relay) sends
  no ``Authorization`` header to an agent's ``/run``, so a token alone would lock it out. The address is the TCP
  peer's, never a forwarded header a caller could write.
- **With ``--require-token``**, also ``Authorization: Bearer <POLAR_API_TOKEN>`` (401 otherwise), compared in
  constant time, for callers that can send one.

A caller that passes is a ``polar.records.audit.Caller``: actor ``gym-agent`` (``gym-agent:<fingerprint>`` when a
token was checked, as the API fingerprints its tokens) and the peer's address, so every batch the agent stores has
its submitter and an audit row.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import orjson
from aiohttp import web
from aiohttp.typedefs import Middleware

from polar.errors import ValidationError
from polar.records.audit import Caller, actor

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_ALLOW_FROM = ("127.0.0.0/8", "::1/128")
ACTOR = "gym-agent"
CALLER = web.RequestKey("caller", Caller)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def allow_list(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """``cidrs`` parsed (an address alone is its own /32 or /128); ``DEFAULT_ALLOW_FROM`` when there are none.
    ValidationError naming the first that is not a network."""
    given = list(cidrs) or list(DEFAULT_ALLOW_FROM)
    networks = []
    for cidr in given:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError as exc:
            raise ValidationError(f"--allow-from {cidr!r}: not an address or CIDR network ({exc})",
                                  field="allow_from") from exc  # fmt: skip
    return tuple(networks)


def is_allowed(address: str | None, networks: Sequence[Network]) -> bool:
    """Whether the peer ``address`` is in one of ``networks`` (an IPv4-mapped IPv6 peer, as a dual-stack listener
    sees IPv4 callers, counts as its IPv4 address). No address (a Unix socket) is not allowed."""
    try:
        ip = ipaddress.ip_address((address or "").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == network.version and ip in network for network in networks)


@dataclass(frozen=True)
class Access:
    """The agent's allow-list, and the token it wants (None: no token asked)."""

    networks: tuple[Network, ...]
    token: str | None = None

    def caller(self, remote: str | None, authorization: str) -> Caller | int:
        """The caller, or the status that refuses it: 403 (not in the allow-list), 401 (a wanted token missing or
        wrong)."""
        if not is_allowed(remote, self.networks):
            return 403
        if self.token is None:
            return Caller(ACTOR, remote)
        scheme, _, supplied = authorization.partition(" ")
        supplied = supplied.strip() if scheme.lower() == "bearer" else ""
        if not supplied or not hmac.compare_digest(supplied.encode(), self.token.encode()):
            return 401
        return Caller(actor(ACTOR, supplied), remote)


def _refusal(status: int, remote: str | None) -> web.Response:
    """The refusal in the shape of the agent's other errors (``web.gym.app``)."""
    if status == 403:
        error = {"message": f"{remote} may not call this agent: not in its --allow-from list", "type": "forbidden"}
    else:
        message = "missing or wrong bearer token (Authorization: Bearer <POLAR_API_TOKEN>)"
        error = {"message": message, "type": "unauthorized"}
    return web.Response(status=status, body=orjson.dumps({"error": error}), content_type="application/json")


def middleware(access: Access) -> Middleware:
    """An aiohttp middleware that refuses callers ``access`` does not let in, before their body is read, and gives
    the others' requests their ``CALLER``."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        found = access.caller(request.remote, request.headers.get("Authorization", ""))
        if isinstance(found, int):
            # A log line, not an audit row: anyone who can reach the port could otherwise fill the table.
            log.warning("gym agent: %d %s %s from %s", found, request.method, request.path, request.remote)
            return _refusal(found, request.remote)
        request[CALLER] = found
        return await handler(request)

    return check
