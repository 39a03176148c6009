"""A harness that rewrites its own history, as a compacting agent does: three chat calls, the third re-sending
the first answer in other words, so prefix merging records a ``diverged`` break (tests/e2e/test_console.py)."""

from __future__ import annotations

from openai import OpenAI

REWRITTEN = "An earlier answer, rewritten by the harness in many more words than the model first used for it."


def run(instruction: str) -> int:
    client = OpenAI(max_retries=0)

    def answer(messages: list) -> str:
        return client.chat.completions.create(model="m", messages=messages).choices[0].message.content or ""

    messages: list = [{"role": "user", "content": instruction}]
    messages += [{"role": "assistant", "content": answer(messages)}, {"role": "user", "content": "Go on."}]
    messages += [{"role": "assistant", "content": answer(messages)}, {"role": "user", "content": "Finish."}]
    messages[1] = {"role": "assistant", "content": REWRITTEN}  # history rewritten: the chain breaks here
    print(answer(messages))
    return 0
