from __future__ import annotations

import json
from pathlib import Path

from polar.refengine.engine_log import EngineLog
from polar.refengine.generation import Generation


def test_appends_one_flushed_line_per_generation(tmp_path: Path) -> None:
    gen = Generation((1, 2), (3, 4), ("a", ""), "a", (), "stop", None)
    log = EngineLog(tmp_path / "sub" / "engine.jsonl")
    log.record("chatcmpl-1", "/v1/chat/completions", gen, "stop")
    lines = (tmp_path / "sub" / "engine.jsonl").read_text().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["prompt_token_ids"] == [1, 2] and record["token_ids"] == [3, 4]
    assert record["request_id"] == "chatcmpl-1" and record["finish_reason"] == "stop" and record["time"] > 0
    log.close()
    log.record("late", "/v1/completions", gen, "stop")
    assert len(log.path.read_text().splitlines()) == 1
