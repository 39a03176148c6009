"""The web console at ``/ui/``, served by the rollout API: batches, sessions, calls and a token-level trajectory
viewer, rendered on the server with Jinja (no front-end build; one small script).

- ``blueprint``: the ``console`` blueprint (templates and static files beside it).
- ``login``: who may look: the API's tokens as a bearer header, or a signed session cookie from the login form.
- ``pages``: the pages; each view parses, calls ``polar.inspection`` / ``polar.lifecycle``, renders.
- ``formatting``: the Jinja filters (durations, JSON, token cells, bar geometry).
- ``registration``: ``register_console(app)``, called by ``web.api.create_app``.

docs/console.md is the user's guide.
"""

from web.console.registration import register_console

__all__ = ["register_console"]
