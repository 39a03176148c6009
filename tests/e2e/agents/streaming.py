"""A harness that streams through the proxy with the official ``openai`` SDK (stream + include_usage), then
makes one non-streamed call continuing the conversation."""

from __future__ import annotations

import os

from openai import OpenAI


def run(instruction: str) -> int:
    client = OpenAI(max_retries=0)
    model = os.environ.get("POLAR_MODEL", "client-model-name")
    messages: list = [{"role": "user", "content": instruction}]
    stream = client.chat.completions.create(
        model=model, messages=messages, stream=True, stream_options={"include_usage": True}
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        assert chunk.model == model, chunk.model
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert usage is not None and usage.completion_tokens > 0 and finish == "stop", (usage, finish)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Thanks. Again?"}]
    reply = client.chat.completions.create(model=model, messages=messages)
    print(text, "|", reply.choices[0].message.content)
    return 0
