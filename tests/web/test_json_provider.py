"""Both apps' JSON provider (orjson): already-serialised items (the feed's) are written as they are, compact or
indented as Flask's debug mode asks, and what orjson cannot encode still goes through Flask's own provider."""

from __future__ import annotations

import json

import orjson
import pytest
from flask import Flask, jsonify

from web.json_provider import FastJSONProvider


@pytest.mark.parametrize("debug", [False, True])
def test_fragments_are_written_as_they_are(debug: bool) -> None:
    app = Flask(__name__)
    app.json = FastJSONProvider(app)
    app.debug = debug
    with app.app_context():
        body = jsonify({"items": [orjson.Fragment('{"token_ids" : [1, 2], "reward" : 0.5}')], "next": 3}).get_data()
    assert json.loads(body) == {"items": [{"token_ids": [1, 2], "reward": 0.5}], "next": 3}
    assert (b'\n  "items"' in body) is debug  # indented by 2 in debug mode, compact otherwise


def test_integers_past_64_bits_fall_back_to_flasks_provider() -> None:
    app = Flask(__name__)
    app.json = FastJSONProvider(app)
    with app.app_context():
        assert json.loads(jsonify({"n": 2**70}).get_data()) == {"n": 2**70}
