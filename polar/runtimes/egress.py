"""On the host: a sandbox's way to the internet, open only to the hosts its task allows.

Sandboxes have no network (``polar.runtimes.relay``). A task that needs some outside host (a package index, a
git server) lists it in ``runtime.egress_allow`` as ``host:port`` (``*.example.org:443`` for subdomains). Then
the run worker also listens on ``egress.sock`` beside the proxy socket, and the harness gets
``HTTPS_PROXY``/``HTTP_PROXY`` pointing at the forwarder's ``127.0.0.1:3128``: each connection must open with an
HTTP ``CONNECT host:port`` naming an allowed host. The gate resolves the name itself and refuses loopback,
link-local (cloud metadata), multicast and unspecified addresses whatever the list says, and every other address
that is not global (private ranges, CGNAT ``100.64.0.0/10`` where one cloud's metadata service lives, reserved
and documentation ranges; IPv4-mapped and NAT64 forms are judged by the IPv4 address they carry) unless the entry
is that literal IP, so a name cannot be pointed at the host's own services or its network's. Plain-HTTP
proxying (``GET http://…``) is refused: ``CONNECT`` carries TLS, and a tunnel is all it grants. The gate holds
the sandbox to its bounds (``polar.runtimes.bounds``): connections at once, ``request_send_s`` to send the whole
CONNECT head (one deadline for all of it, however it trickles in), and ``tunnel_idle_s``: a tunnel that carries
no byte either way for that long is closed, both ends. Its tunnels (both ends) are held in ``served``, so the end
of the harness's run ends them, and their threads, whatever the remote host does.
"""

from __future__ import annotations

import contextlib
import fnmatch
import ipaddress
import socket
import time
from collections.abc import Sequence

from polar.runtimes import forwarder
from polar.runtimes.bounds import SandboxBounds, Served, serve_bounded

PORT_INSIDE = 3128
HEADER_LIMIT = 8192
CONNECT_TIMEOUT_S = 10.0


class Refused(Exception):
    """A CONNECT the allow-list or the address rules do not permit; the message goes back to the client."""


def parse_entry(entry: str) -> tuple[str, int]:
    """``host:port`` of an allow-list entry (``[v6]:port`` for IPv6 literals); raises ``ValueError``."""
    host, sep, port = entry.rpartition(":")
    host = host.strip("[]").lower()
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{entry!r} is not host:port")
    return host, int(port)


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


Address = ipaddress.IPv4Address | ipaddress.IPv6Address
NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _carried(address: Address) -> Address:
    """The IPv4 address an IPv4-mapped or NAT64 IPv6 address reaches; otherwise the address itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _never(address: Address) -> bool:
    address = _carried(address)
    return address.is_loopback or address.is_link_local or address.is_multicast or address.is_unspecified


def _not_global(address: Address) -> bool:
    """Private, shared (CGNAT), reserved or otherwise not on the public internet."""
    return not _carried(address).is_global


class EgressGate:
    """Decides and opens the tunnels of one sandbox."""

    def __init__(self, allow: Sequence[str], bounds: SandboxBounds | None = None) -> None:
        self.allow = [parse_entry(entry) for entry in allow]
        self.bounds = bounds or SandboxBounds()
        self.served = Served()  # the tunnels' connections, both ends: ``served.end()`` ends them

    def _entry_for(self, host: str, port: int) -> tuple[str, int] | None:
        for pattern, allowed_port in self.allow:
            if allowed_port == port and fnmatch.fnmatchcase(host, pattern):
                return pattern, allowed_port
        return None

    def open(self, target: str) -> socket.socket:
        """A connection to ``target`` (``host:port`` from a CONNECT line), or ``Refused`` saying why."""
        try:
            host, port = parse_entry(target)
        except ValueError as exc:
            raise Refused(str(exc)) from exc
        entry = self._entry_for(host, port)
        if entry is None:
            raise Refused(f"{host}:{port} is not in this task's runtime.egress_allow")
        literal = _literal(entry[0])
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise Refused(f"cannot resolve {host}: {exc}") from exc
        last: OSError | None = None
        for family, kind, proto, _, address in found:
            ip = ipaddress.ip_address(address[0])
            if _never(ip) or (_not_global(ip) and ip != literal):
                last = OSError(f"{host} resolves to {ip}, which a sandbox may not reach")
                continue
            upstream = socket.socket(family, kind, proto)
            upstream.settimeout(CONNECT_TIMEOUT_S)
            try:
                upstream.connect(address)
            except OSError as exc:
                upstream.close()
                last = exc
                continue
            upstream.settimeout(None)
            return upstream
        raise Refused(f"cannot connect to {host}:{port}: {last}")

    def serve(self, listener: socket.socket) -> None:
        """Accept on ``listener`` until it is closed; answer each CONNECT with a tunnel or a refusal."""
        serve_bounded(listener, self._tunnel, self.bounds, self.served)

    def _tunnel(self, client: socket.socket) -> None:
        try:
            # The whole head within request_send_s: an idle or trickling CONNECT does not hold its thread for long.
            head = _read_head(client, time.monotonic() + self.bounds.request_send_s)
            method, target, _ = (head.split(b"\r\n", 1)[0].decode("latin-1") + "  ").split(" ", 2)
            if method != "CONNECT":
                raise Refused("only CONNECT tunnels are allowed (use https:// URLs)")
            upstream = self.open(target)
            if not self.served.add(upstream):
                upstream.close()
                raise Refused("the sandbox's session is ending")
        except (Refused, OSError) as exc:
            with contextlib.suppress(OSError):
                reason = str(exc).encode()
                client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                               b"Connection: close\r\n\r\n%s" % (len(reason), reason))  # fmt: skip
            client.close()
            return
        idle_s = self.bounds.tunnel_idle_s
        try:
            for sock in (client, upstream):
                sock.settimeout(idle_s)  # no write here waits on a peer that does not read for longer than that
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            early = head.split(b"\r\n\r\n", 1)[1]  # what a client sent before waiting for the 200
            if early:
                upstream.sendall(early)
            forwarder.splice(client, upstream, idle_s)
        except OSError:
            client.close()
        finally:
            self.served.discard(upstream)
            upstream.close()


def _read_head(client: socket.socket, deadline: float) -> bytes:
    """The CONNECT head, all of it by ``deadline`` (``TimeoutError`` past it)."""
    head = b""
    while b"\r\n\r\n" not in head:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the CONNECT head was not sent within this sandbox's request_send_s")
        client.settimeout(left)
        chunk = client.recv(1024)
        if not chunk:
            raise Refused("connection closed before a request")
        head += chunk
        if len(head) > HEADER_LIMIT:
            raise Refused("request head too long")
    return head
