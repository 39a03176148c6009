from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from polar.chat.tokenizer import Tokenizer
from tests.polar.conftest import RunningEngine, stream_events
from tests.processes import wait_until

StartEngine = Callable[..., RunningEngine]
HANG_GUARD_S = 60  # waits and client timeouts below are hang guards, not speed claims
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
QUESTION = [{"role": "user", "content": "What is 12 * (7 + 3)?"}]
CAPTURE = {"return_token_ids": True, "logprobs": True, "top_logprobs": 0, "seed": 11}


def _chat(engine: RunningEngine, **body: Any) -> dict[str, Any]:
    response = engine.client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _stream(engine: RunningEngine, **body: Any) -> list[dict[str, Any]]:
    response = engine.client.post("/v1/chat/completions", json={**body, "stream": True})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    return stream_events(response.text)


def test_tool_call_turn_streamed_and_not(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine(policy="arithmetic", policy_config={"accuracy": 1.0})
    body = _chat(engine, messages=QUESTION, tools=TOOLS, **CAPTURE)
    choice = body["choices"][0]
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "polar-reference" and choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
    assert json.loads(call["function"]["arguments"]) == {"expression": "12 * (7 + 3)"}
    assert choice["message"]["reasoning"] and "reasoning_content" not in choice["message"]
    ids = choice["token_ids"]
    assert ids[-1] == tok.eos_token_id
    assert len(ids) == body["usage"]["completion_tokens"] == len(choice["logprobs"]["content"])
    assert len(body["prompt_token_ids"]) == body["usage"]["prompt_tokens"]
    assert tok.decode(ids, skip_special_tokens=True).startswith(f"<think>{choice['message']['reasoning']}</think>")
    assert all(entry["top_logprobs"] == [] for entry in choice["logprobs"]["content"])

    events = _stream(engine, messages=QUESTION, tools=TOOLS, stream_options={"include_usage": True}, **CAPTURE)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["prompt_token_ids"] == body["prompt_token_ids"]
    streamed = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids", [])]
    assert streamed == ids
    logprobs = [
        e["logprob"] for c in chunks for ch in c["choices"] if ch.get("logprobs") for e in ch["logprobs"]["content"]
    ]
    assert logprobs == [e["logprob"] for e in choice["logprobs"]["content"]]
    deltas = [ch["delta"] for c in chunks for ch in c["choices"]]
    reasoning = "".join(d.get("reasoning", "") for d in deltas)
    assert reasoning == choice["message"]["reasoning"]
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "calculator" and calls[0]["id"].startswith("chatcmpl-tool-")
    assert "".join(tc["function"].get("arguments", "") for tc in calls) == call["function"]["arguments"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == body["usage"]


def test_two_turn_tool_loop_extends_the_prompt(start_engine: StartEngine, tmp_path: Path, tok: Tokenizer) -> None:
    log = tmp_path / "engine.jsonl"
    engine = start_engine(policy="arithmetic", policy_config={"accuracy": 1.0}, log_path=str(log))
    first = _chat(engine, messages=QUESTION, tools=TOOLS, **CAPTURE)
    message = first["choices"][0]["message"]
    history = [
        *QUESTION,
        {k: message[k] for k in ("role", "content", "reasoning", "tool_calls")},
        {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "120"},
    ]
    second = _chat(engine, messages=history, tools=TOOLS, **CAPTURE)
    assert second["choices"][0]["message"]["content"].strip() == "The answer is 120."
    assert second["choices"][0]["finish_reason"] == "stop"
    sampled = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][: len(sampled)] == sampled
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["token_ids"] for r in records] == [first["choices"][0]["token_ids"], second["choices"][0]["token_ids"]]
    assert records[1]["prompt_token_ids"] == second["prompt_token_ids"]
    assert records[0]["request_id"] == first["id"] and records[0]["finish_reason"] == "tool_calls"


def test_length_and_stop_strings(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine(policy="scripted", policy_config={"turns": [{"content": "Alpha beta gamma delta."}]})
    cut = _chat(engine, messages=QUESTION, max_tokens=3, **CAPTURE)["choices"][0]
    assert cut["finish_reason"] == "length" and len(cut["token_ids"]) == 3
    assert cut["message"]["content"] == tok.decode(cut["token_ids"])
    stopped = _chat(engine, messages=QUESTION, stop=["gamma"], **CAPTURE)["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == "gamma"
    assert stopped["message"]["content"] == "Alpha beta "
    events = _stream(engine, messages=QUESTION, stop=["gamma"], **CAPTURE)
    assert [i for c in events[:-1] for ch in c["choices"] for i in ch.get("token_ids", [])] == stopped["token_ids"]
    assert "".join(ch["delta"].get("content", "") for c in events[:-1] for ch in c["choices"]) == "Alpha beta "


def test_tool_choice_none_and_token_id_strings(start_engine: StartEngine) -> None:
    turns = [{"content": "Sure.", "tool_calls": [{"name": "calculator", "arguments": {"expression": "1 + 1"}}]}]
    engine = start_engine(policy="scripted", policy_config={"turns": turns})
    auto = _chat(engine, messages=QUESTION, tools=TOOLS)["choices"][0]
    assert auto["finish_reason"] == "tool_calls" and auto["message"]["content"] == "Sure.\n"
    none = _chat(engine, messages=QUESTION, tools=TOOLS, tool_choice="none", **CAPTURE, return_tokens_as_token_ids=True)
    choice = none["choices"][0]
    assert (
        choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    )  # dropped when empty, as vLLM does
    assert choice["message"]["content"] == "Sure."
    assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{i}" for i in choice["token_ids"]]


def test_completions_with_token_ids(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine(policy="arithmetic", policy_config={"accuracy": 1.0})
    chat = _chat(engine, messages=QUESTION, tools=TOOLS, **CAPTURE)
    body = {"prompt": chat["prompt_token_ids"], "max_tokens": 200, "logprobs": 1, "return_token_ids": True}
    response = engine.client.post("/v1/completions", json={**body, "seed": 11})
    assert response.status_code == 200, response.text
    completion = response.json()
    choice = completion["choices"][0]
    assert completion["object"] == "text_completion" and completion["id"].startswith("cmpl-")
    assert choice["prompt_token_ids"] == chat["prompt_token_ids"]
    assert choice["token_ids"] == chat["choices"][0]["token_ids"]
    assert choice["text"] == tok.decode(choice["token_ids"], skip_special_tokens=True)
    assert "<tool_call>" in choice["text"] and choice["finish_reason"] == "stop"
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(choice["token_ids"]) == len(logprobs["text_offset"])
    assert logprobs["text_offset"][0] == 0 and all(len(t) == 1 for t in logprobs["top_logprobs"])
    short = engine.client.post("/v1/completions", json={"prompt": "<|im_start|>user\n2 + 2<|im_end|>\n"}).json()
    assert short["usage"]["completion_tokens"] <= 16
    streamed = engine.client.post("/v1/completions", json={**body, "seed": 11, "stream": True})
    events = stream_events(streamed.text)
    assert [i for c in events[:-1] for ch in c["choices"] for i in ch["token_ids"]] == choice["token_ids"]
    assert events[0]["choices"][0]["prompt_token_ids"] == chat["prompt_token_ids"]


def test_tokenize_matches_chat_prompt(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine()
    chat = _chat(engine, messages=QUESTION, tools=TOOLS, **CAPTURE)
    tokenized = engine.client.post("/tokenize", json={"messages": QUESTION, "tools": TOOLS}).json()
    assert tokenized["tokens"] == chat["prompt_token_ids"] and tokenized["count"] == len(tokenized["tokens"])
    assert tokenized["max_model_len"] == 32768 and tokenized["token_strs"] is None
    plain = engine.client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    assert plain["token_strs"] == [tok.id_to_token(i) for i in plain["tokens"]]
    detok = engine.client.post("/detokenize", json={"tokens": plain["tokens"]}).json()
    assert detok == {"prompt": "Hello world"}


def test_models_health_version_and_metrics(start_engine: StartEngine) -> None:
    engine = start_engine(model="qwen3", max_model_len=4096)
    models = engine.client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "qwen3"
    assert models["data"][0]["max_model_len"] == 4096 and models["data"][0]["owned_by"] == "vllm"
    health = engine.client.get("/health")
    assert health.status_code == 200 and health.content == b""
    assert "version" in engine.client.get("/version").json()
    used = _chat(engine, messages=QUESTION, **CAPTURE)["usage"]
    metrics = engine.client.get("/metrics").text
    assert 'vllm:num_requests_running{engine="0",model_name="qwen3"} 0.0' in metrics
    assert f'vllm:generation_tokens_total{{engine="0",model_name="qwen3"}} {used["completion_tokens"]}.0' in metrics
    assert f'vllm:prompt_tokens_total{{engine="0",model_name="qwen3"}} {used["prompt_tokens"]}.0' in metrics


def test_waiting_requests_show_in_metrics(start_engine: StartEngine) -> None:
    # Decoding so slowly that the first request holds the only slot for minutes: the other two find it taken
    # however long a loaded machine takes to send them. The test then cuts the sequences short (abort).
    engine = start_engine(max_num_seqs=1, decode_tokens_per_s=0.1)
    answers: list[httpx.Response] = []
    ask = {"messages": QUESTION}
    threads = [threading.Thread(target=lambda: answers.append(engine.client.post("/v1/chat/completions", json=ask)))
               for _ in range(3)]  # fmt: skip
    for thread in threads:
        thread.start()
    try:
        waiting = 'vllm:num_requests_waiting{engine="0",model_name="polar-reference"} 2.0'

        def two_waiting() -> str | None:
            text = engine.client.get("/metrics").text
            return text if waiting in text else None

        seen = wait_until(two_waiting, HANG_GUARD_S, "two requests waiting")
        assert 'vllm:num_requests_running{engine="0",model_name="polar-reference"} 1.0' in seen
    finally:

        def cut_short() -> bool:  # whichever sequence runs now ends with what it decoded
            engine.client.post("/pause", params={"mode": "abort"})
            engine.client.post("/resume")
            return not any(thread.is_alive() for thread in threads)

        wait_until(cut_short, HANG_GUARD_S, "every request answered")
    assert [a.status_code for a in answers] == [200] * 3
    assert [a.json()["choices"][0]["finish_reason"] for a in answers] == ["abort"] * 3


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/chat/completions", "{not json", 400, "not valid JSON"),
        ("/v1/chat/completions", {"model": "polar-reference"}, 400, "messages"),
        ("/v1/chat/completions", {"messages": QUESTION, "model": "gpt-9"}, 404, "does not exist"),
        ("/v1/chat/completions", {"messages": QUESTION, "continue_final_message": True}, 400, "Cannot set both"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 5000}]}, 400, "maximum context"),
        ("/v1/chat/completions", {"messages": QUESTION, "stream_options": {}}, 400, "stream"),
        ("/v1/completions", {"prompt": [10**9]}, 400, "out of vocabulary"),
        ("/detokenize", {"tokens": [-1]}, 400, "out of vocabulary"),
        ("/v1/embeddings", {}, 404, "Not Found"),
    ],
)
def test_errors_have_vllm_shape(start_engine: StartEngine, path: str, body: Any, status: int, message: str) -> None:
    engine = start_engine(max_model_len=2048)
    content = body if isinstance(body, str) else json.dumps(body)
    response = engine.client.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert error["type"] == ("BadRequestError" if status == 400 else "NotFoundError")
    assert message in error["message"]


def test_official_openai_client(start_engine: StartEngine) -> None:
    engine = start_engine(policy="arithmetic", policy_config={"accuracy": 1.0})
    client = openai.OpenAI(
        base_url=f"{engine.url}/v1", api_key="unused", http_client=httpx.Client(timeout=HANG_GUARD_S)
    )
    result = client.chat.completions.create(model="polar-reference", messages=QUESTION, tools=TOOLS, seed=1)
    assert result.choices[0].message.tool_calls[0].function.name == "calculator"
    stream = client.chat.completions.create(
        model="polar-reference", messages=QUESTION, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "\n\nThe answer is 120."  # raw text after </think>, as vLLM returns it
    assert chunks[-1].usage is not None
