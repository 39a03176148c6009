"""Flask's JSON through orjson for both apps: the proxy answers bodies of hundreds of KB (a response carries the
whole prompt's token ids when a client asks), the API pages of trajectories and calls. Key order is kept; what
orjson cannot encode (integers past 64 bits) goes through Flask's own provider."""

from __future__ import annotations

from typing import Any

import orjson
from flask.json.provider import DefaultJSONProvider


class FastJSONProvider(DefaultJSONProvider):
    sort_keys = False

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        # Indented (Flask's debug mode indents by 2) through orjson too: the feed's items are orjson fragments.
        option = orjson.OPT_PASSTHROUGH_DATETIME | (orjson.OPT_INDENT_2 if kwargs.get("indent") else 0)
        try:
            return orjson.dumps(obj, default=self.default, option=option).decode()
        except TypeError:
            return super().dumps(obj, **kwargs)
