"""Where a batch's ``callback_url`` may point: not at the host's own services.

A callback is a POST that a worker makes to a URL from a request body, so it must not reach what only the
workers can reach: loopback, link-local (the cloud metadata address 169.254.169.254), private and other
non-global ranges, ``0.0.0.0`` and their IPv6 equivalents (IPv4-mapped, -compatible, NAT64 and 6to4 forms are
judged by the IPv4 address inside). The operator opens exceptions with ``POLAR_CALLBACK_ALLOW``: ``host[:port]``
(a name as written in the URL, or an address) or a CIDR block.

The URL is checked at submission (a 400) and again at delivery, where every address the name resolves to must
pass and the POST goes to one of those very addresses (``Target``), so a name that re-resolves elsewhere between
the check and the connection (DNS rebinding) gains nothing.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from polar.errors import ValidationError

SETTING = "POLAR_CALLBACK_ALLOW"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]

_COMPATIBLE = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class CallbackRefused(ValueError):
    """A callback URL that would reach a refused address, or cannot be resolved."""


@dataclass(frozen=True)
class _Allowed:
    network: IPNetwork | None
    host: str | None
    port: int | None


@dataclass(frozen=True)
class Target:
    """Where to send a callback: the checked ``address``, with the URL's own ``host`` for the Host header and
    TLS (server name and certificate check)."""

    address: str
    port: int
    host: str


def _split_host_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, int(port)
    return entry, None


def parse_allow(entries: Sequence[str]) -> tuple[_Allowed, ...]:
    """``POLAR_CALLBACK_ALLOW``'s entries, or a ``ValidationError`` naming the bad one."""
    parsed = []
    for entry in entries:
        try:
            if "/" in entry:
                parsed.append(_Allowed(ipaddress.ip_network(entry, strict=False), None, None))
                continue
            host, port = _split_host_port(entry)
            if port is not None and not 0 < port < 65536:
                raise ValueError("port out of range")
            try:
                address = ipaddress.ip_address(host)
            except ValueError:
                if not host or any(c in host for c in "/@?#[] "):
                    raise ValueError("not a host name") from None
                parsed.append(_Allowed(None, host.lower().rstrip("."), port))
            else:
                parsed.append(_Allowed(ipaddress.ip_network(address), None, port))
        except ValueError as exc:
            raise ValidationError(
                f"{SETTING}: {entry!r} is not host[:port], an address or a CIDR block ({exc})", field=SETTING
            ) from exc
    return tuple(parsed)


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _COMPATIBLE or address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def internal(address: IPAddress) -> bool:
    """True for an address of the host's own or private networks (anything not globally routable)."""
    inner = _embedded_ipv4(address)
    if inner is not None and internal(inner):
        return True
    if isinstance(address, ipaddress.IPv6Address) and address in _COMPATIBLE:
        return True  # ::/96 is either unspecified/loopback or a deprecated tunnel form: never a real receiver
    return not address.is_global or address.is_multicast


def _resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _url_parts(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise CallbackRefused("must be an http(s) URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise CallbackRefused(f"bad port: {exc}") from exc
    return parts.hostname.lower().rstrip("."), port


def _allowed_address(address: IPAddress, port: int, allow: Sequence[_Allowed]) -> bool:
    return any(a.network is not None and address in a.network and a.port in (None, port) for a in allow)


def resolve_target(url: str, allow_entries: Sequence[str], resolve: Resolver = _resolve) -> list[Target]:
    """The addresses ``url`` may be POSTed to, in resolver order; ``CallbackRefused`` when any address its host
    resolves to is refused (or it resolves to nothing)."""
    allow = parse_allow(allow_entries)
    host, port = _url_parts(url)
    named = any(a.host == host and a.port in (None, port) for a in allow)
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = resolve(host, port)
        except (OSError, UnicodeError) as exc:
            raise CallbackRefused(f"cannot resolve {host!r}: {exc}") from exc
        if not addresses:
            raise CallbackRefused(f"{host!r} resolves to no address")
    if not named:
        for text in addresses:
            address = ipaddress.ip_address(text.partition("%")[0])
            if internal(address) and not _allowed_address(address, port, allow):
                shown = host if literal is not None else f"{host!r} (resolving to {text})"
                raise CallbackRefused(
                    f"{shown} is a loopback, link-local or private address; the operator allows such receivers "
                    f"with {SETTING} (host[:port] or CIDR)"
                )
    return [Target(text, port, host) for text in addresses]


def check_callback_url(url: str, allow_entries: Sequence[str], field: str = "callback_url") -> None:
    """Refuse, with a ``ValidationError`` naming ``field``, a callback URL that reaches a refused address."""
    try:
        resolve_target(url, allow_entries)
    except CallbackRefused as exc:
        raise ValidationError(f"{field}: {exc}", field=field) from exc
