"""PostgreSQL and Redis instances of a test's own, so it can restart them (or kill them) without touching the
machine's services: Postgres via ``initdb`` / ``pg_ctl`` under the ``postgres`` user when run as root, Redis with
its append-only file on, so a restart keeps what was acknowledged."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import redis

from polar.local.launcher import free_port


def _postgres_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        raise RuntimeError(f"PostgreSQL's {name} is not installed")
    return found[-1]


def _wait(ready: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up in {timeout_s:g}s")


class PrivatePostgres:
    """A PostgreSQL cluster in a temporary directory, on a free port, trust auth on loopback."""

    def __init__(self) -> None:
        # Not under pytest's tmp dirs: the postgres user must be able to reach its data directory.
        self.root = Path(tempfile.mkdtemp(prefix="polar-pg-"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self._run(_postgres_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")

    def _run(self, *argv: str) -> None:
        command = ["runuser", "-u", "postgres", "--", *argv] if self._as_postgres else list(argv)
        subprocess.run(command, check=True, capture_output=True, cwd=self.root)

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
            " -c max_connections=300"
        )
        log = str(self.root / "postgres.log")
        self._run(_postgres_bin("pg_ctl"), "-D", str(self.data), "-l", log, "-o", options, "-w", "start")
        _wait(self._answers, "postgres")

    def _answers(self) -> bool:
        try:
            with psycopg.connect(self.admin_dsn, connect_timeout=1) as connection:
                connection.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def stop(self, mode: str = "fast") -> None:
        """``immediate`` is a crash: no checkpoint, recovery from the WAL at the next start."""
        self._run(_postgres_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, down_s: float = 1.0) -> None:
        self.stop("immediate")
        time.sleep(down_s)
        self.start()

    def _processes(self) -> list[int]:
        """The postmaster and every backend it forked."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
        return [postmaster, *(int(pid) for pid in children)]

    def pause(self) -> None:
        """SIGSTOP the whole server: connections stay open, every query hangs (a frozen VM, a stalled disk)."""
        for pid in self._processes():
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in self._processes():
            os.kill(pid, signal.SIGCONT)

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.admin_dsn, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def close(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """A Redis server on a free port with the append-only file on (``everysec``), restartable on the same data."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="polar-redis-"))
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.root),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--logfile", str(self.root / "redis.log"),
        ]  # fmt: skip
        self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
        _wait(self._answers, "redis")

    def _answers(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: what the append-only file had not yet synced (up to a second) is lost, as in a crash."""
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()

    def restart(self, down_s: float = 1.0) -> None:
        self.kill()
        time.sleep(down_s)
        self.start()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)
