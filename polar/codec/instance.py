"""Which stack a server belongs to. ``polar.local.launcher.Stack`` gives each stack an id (``POLAR_INSTANCE``) that its
servers echo on their health checks, so a stack waiting for its engine on a port never takes another stack's
engine, which got the port first, for its own (two embedded stacks started at once both find 8000 free)."""

from __future__ import annotations

import os

ENV = "POLAR_INSTANCE"
HEADER = "X-Polar-Instance"


def instance_headers() -> dict[str, str]:
    """The header a health check answers with: this process's stack id, when a launcher started it."""
    instance = os.environ.get(ENV)
    return {HEADER: instance} if instance else {}
