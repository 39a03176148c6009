"""On the host: the one door out of a sandbox, a Unix socket that leads to the proxy and nowhere else.

A harness in a ``bwrap`` or ``docker`` sandbox is written by a policy being rewarded; given the host's network it
could rewrite its reward in Postgres, queue Celery messages, submit batches or call the engine uncaptured. So a
sandbox gets a network namespace with only loopback (bwrap ``--unshare-net``, Docker ``network_mode="none"``)
and, bind-mounted at ``/run/polar-proxy``, a directory holding ``proxy.sock``. While the harness runs, a
``ProxyRelay`` in the run worker listens there and connects each connection to the proxy's host and port from
``POLAR_PROXY_URL``; inside, ``polar.runtimes.forwarder`` serves it on ``127.0.0.1:<proxy port>``. The harness's
base URLs name that inside address, so they look as they would on the host; the proxy may be on another machine.

The relay carries HTTP/1.1 (keep-alive, streaming answers) request by request (``polar.runtimes.http_carry``): the
connection it makes goes to exactly one address, chosen by the operator, never by the sandbox, and with the
``Host`` the operator's URL names, whatever the sandbox sent. Each socket holds the sandbox to its bounds
(``polar.runtimes.bounds``): connections at once, threads, time to send a request, bytes. When the harness's run
ends, so does every connection either socket still serves (both its ends), and their threads with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from polar.errors import RuntimeFailure
from polar.runtimes import forwarder
from polar.runtimes.bounds import END_JOIN_S, SandboxBounds, Served, serve_bounded
from polar.runtimes.egress import PORT_INSIDE as EGRESS_PORT
from polar.runtimes.egress import EgressGate
from polar.runtimes.http_carry import Carry

INSIDE_DIR = "/run/polar-proxy"
SOCKET_NAME = "proxy.sock"
EGRESS_SOCKET_NAME = "egress.sock"
CONNECT_TIMEOUT_S = 10.0
UNPRIVILEGED_PORT = 8100


def relay_dir(session_dir: Path) -> Path:
    """The host directory mounted at ``INSIDE_DIR`` for the runtime at ``session_dir``. Unix socket paths are
    limited to 107 bytes, so it lives under a short root named by a digest of the session directory."""
    digest = hashlib.sha256(str(session_dir).encode()).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / f"polar-relay-{os.getuid()}" / digest


def _owned_directory(path: Path, mode: int) -> None:
    """``path`` as a real directory of this user with ``mode``: made if missing, refused if it is a link or
    another user's (the shared temporary directory is anyone's to plant names in)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise RuntimeFailure(f"{path} is not a directory of this user; refusing to use it for a sandbox's sockets")
    os.chmod(path, mode)


def make_relay_dir(session_dir: Path) -> Path:
    """Create (empty) the relay directory of ``session_dir``: at create, so a container can mount it."""
    directory = relay_dir(session_dir)
    _owned_directory(directory.parent, 0o711)
    shutil.rmtree(directory, ignore_errors=True)
    # The sandbox's user traverses it; the sockets themselves are the sandbox user's alone.
    _owned_directory(directory, 0o755)
    return directory


def remove_relay_dir(session_dir: Path) -> None:
    shutil.rmtree(relay_dir(session_dir), ignore_errors=True)


@dataclass(frozen=True)
class ProxyTarget:
    """Where a sandbox's proxy traffic goes on the host side, and the port and URL it uses inside."""

    host: str
    port: int
    inside_port: int
    inside_url: str
    host_header: str = ""  # what the proxy's requests carry as Host: the operator's URL's, never the sandbox's

    @classmethod
    def from_url(cls, proxy_url: str) -> ProxyTarget:
        parts = urlsplit(proxy_url)
        if not parts.hostname:
            raise RuntimeFailure(f"POLAR_PROXY_URL {proxy_url!r} names no host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        # A sandbox's user holds no capability to bind a port below 1024: the proxy's 80 is 8100 inside.
        inside = port if port >= 1024 else UNPRIVILEGED_PORT
        inside_url = f"{parts.scheme}://127.0.0.1:{inside}{parts.path.rstrip('/')}"
        return cls(parts.hostname, port, inside, inside_url, parts.netloc.rpartition("@")[2])


@dataclass(frozen=True)
class ProxyAccess:
    """How a harness reaches the proxy from where it runs: the base URL to use there, what its command must be
    wrapped in (the forwarder, inside a sandbox), and environment to add (the egress proxy, when allowed)."""

    url: str
    wrap: Callable[[list[str]], list[str]]
    env: dict[str, str] = field(default_factory=dict)


def direct(proxy_url: str) -> ProxyAccess:
    """No sandbox network: the harness uses the proxy URL as it is."""
    return ProxyAccess(proxy_url, lambda command: command)


def _listen(path: Path, owner: tuple[int, int] | None) -> socket.socket:
    """A Unix socket at ``path`` only ``owner`` (the sandbox's user) may connect to."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        os.chmod(path, 0o600)
        if owner is not None and os.getuid() == 0:
            os.chown(path, *owner)
        listener.listen(128)
    except OSError as exc:
        listener.close()
        raise RuntimeFailure(f"cannot open the sandbox's socket {path}: {exc}") from exc
    return listener


def _close(listener: socket.socket, path: Path) -> None:
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class ProxyRelay:
    """A Unix socket at ``directory/proxy.sock`` whose every connection is carried to ``target``; ``stop`` ends
    the socket and every connection it serves, and their threads."""

    def __init__(
        self,
        directory: Path,
        target: ProxyTarget,
        owner: tuple[int, int] | None = None,
        bounds: SandboxBounds | None = None,
        key_hash: str | None = None,
    ) -> None:
        self.path = directory / SOCKET_NAME
        self.key_hash = key_hash
        self.target = target
        self.owner = owner
        self.bounds = bounds or SandboxBounds()
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self._served = Served()

    def start(self) -> None:
        self._listener = _listen(self.path, self.owner)
        args = (self._listener, self._carry, self.bounds, self._served)
        self._accepting = threading.Thread(target=serve_bounded, args=args, daemon=True)
        self._accepting.start()

    def _carry(self, client: socket.socket) -> None:
        host = self.target.host_header.encode("idna")
        Carry(client, self._connect, host, self.bounds, self._served, self.key_hash).run()

    def _connect(self) -> socket.socket:
        upstream = socket.create_connection((self.target.host, self.target.port), timeout=CONNECT_TIMEOUT_S)
        upstream.settimeout(None)
        return upstream

    def stop(self) -> None:
        if self._listener is not None:
            _close(self._listener, self.path)
            self._listener = None
        _end(self._accepting, self._served)


def _end(accepting: threading.Thread | None, served: Served) -> None:
    """After its listener closed: the accept loop's end, then every connection it served, both ends (bounded)."""
    if accepting is not None:
        accepting.join(END_JOIN_S)
    served.end()


@contextlib.contextmanager
def _egress(
    directory: Path, allow: Sequence[str], owner: tuple[int, int] | None, bounds: SandboxBounds
) -> Iterator[list[str]]:
    """The egress gate's socket while the block runs (none when nothing is allowed); the forwarder's arguments."""
    if not allow:
        yield []
        return
    path = directory / EGRESS_SOCKET_NAME
    listener = _listen(path, owner)
    gate = EgressGate(allow, bounds)
    accepting = threading.Thread(target=gate.serve, args=(listener,), daemon=True)
    accepting.start()
    try:
        yield ["--forward", f"127.0.0.1:{EGRESS_PORT}={INSIDE_DIR}/{EGRESS_SOCKET_NAME}"]
    finally:
        _close(listener, path)
        _end(accepting, gate.served)


def _egress_env() -> dict[str, str]:
    proxy = f"http://127.0.0.1:{EGRESS_PORT}"
    env = {name: proxy for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")}
    return {**env, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


@contextlib.contextmanager
def relayed(
    session_dir: Path,
    proxy_url: str,
    owner: tuple[int, int] | None = None,
    egress_allow: Sequence[str] = (),
    bounds: SandboxBounds | None = None,
    key_hash: str | None = None,
) -> Iterator[ProxyAccess]:
    """A relay for the sandbox at ``session_dir`` while the block runs, and how its harness reaches it; with
    ``egress_allow``, also the gate to those outside hosts (``polar.runtimes.egress``); both held to ``bounds``.
    With ``key_hash`` (the sha256 of the session's proxy key), requests carrying any other key are refused."""
    bounds = bounds or SandboxBounds()
    target = ProxyTarget.from_url(proxy_url)
    directory = relay_dir(session_dir)
    _owned_directory(directory.parent, 0o711)
    _owned_directory(directory, 0o755)
    relay = ProxyRelay(directory, target, owner, bounds, key_hash)
    relay.start()
    try:
        with _egress(directory, egress_allow, owner, bounds) as egress_args:
            inside = [
                sys.executable, "-I", forwarder.__file__,
                "--forward", f"127.0.0.1:{target.inside_port}={INSIDE_DIR}/{SOCKET_NAME}", *egress_args, "--",
            ]  # fmt: skip
            env = _egress_env() if egress_args else {}
            yield ProxyAccess(target.inside_url, lambda command: [*inside, *command], env)
    finally:
        relay.stop()
