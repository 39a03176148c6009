"""Host files outside every session, for the tests that plant a link in a session directory: what the link points
at, and a check that nothing there changed (content, mode, owner, the files present).

As root, everything here is owned by ``STRANGER`` (no user of this machine), so a ``chown`` to the worker or to
the container's user shows; ``victim.pth`` stands for a file whose change runs code (a ``.pth`` file), ``secret``
for one a session must never read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from polar.errors import UnsafePath

STRANGER = 4242
SECRET = "0.97 TOPSECRET"
VICTIM = "import sys  # a .pth line runs at every interpreter start\n"

Snapshot = dict[str, tuple[bytes | None, int, int, int]]


@dataclass
class Outside:
    root: Path
    before: Snapshot = field(default_factory=dict)

    @classmethod
    def make(cls, tmp_path: Path) -> Outside:
        root = tmp_path / "outside"
        root.mkdir()
        (root / "victim.pth").write_text(VICTIM)
        (root / "secret").write_text(SECRET)
        (root / "reward.txt").write_text("0.97\n")  # a reward the session did not earn
        (root / "model.patch").write_text(SECRET)
        for path in (root, *root.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
            if os.geteuid() == 0:
                os.chown(path, STRANGER, STRANGER)
        outside = cls(root)
        outside.before = outside.snapshot()
        return outside

    @property
    def victim(self) -> Path:
        return self.root / "victim.pth"

    @property
    def secret(self) -> Path:
        return self.root / "secret"

    def snapshot(self) -> Snapshot:
        found: Snapshot = {}
        for directory, dirs, files in os.walk(self.root):
            for name in (directory, *(os.path.join(directory, entry) for entry in (*dirs, *files))):
                info = os.lstat(name)
                content = Path(name).read_bytes() if os.path.isfile(name) else None
                found[os.path.relpath(name, self.root)] = (content, info.st_mode, info.st_uid, info.st_gid)
        return found

    def assert_unchanged(self) -> None:
        now = self.snapshot()
        changed = {name: (self.before.get(name), now.get(name)) for name in {*now, *self.before}
                   if now.get(name) != self.before.get(name)}  # fmt: skip
        assert not changed, f"outside the session, (before, after) changed: {changed}"


def refusal(action: Callable[[], object]) -> str | None:
    """The message of the ``UnsafePath`` that ``action`` raised; None when it went through or failed otherwise
    (so a test checks what is outside first, then that the refusal was the reason)."""
    try:
        action()
    except UnsafePath as exc:
        return str(exc)
    except Exception:
        return None
    return None
