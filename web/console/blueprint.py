"""The console's blueprint: pages under ``/ui``, templates under ``console/``, files under ``/ui/static``.

Its routes live in ``web.console.login`` and ``web.console.pages``; ``web.console.registration`` attaches it."""

from __future__ import annotations

from flask import Blueprint

blueprint = Blueprint("console", __name__, url_prefix="/ui", template_folder="templates", static_folder="static")
