"""Small helpers with nothing of Polar below them: JSON bodies, socket readiness, URLs shown without their secrets,
``package.module:attribute`` import paths, the stack a server belongs to, and bounded long-poll slots."""
