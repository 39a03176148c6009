"""How TITO ties a resent assistant message to the call that answered it (``polar.proxy.tito._identities``): by its
tool-call ids, or, when a client renames them and re-serialises the arguments (Factory's Droid), by the calls' names
and parsed arguments; a text answer by its text. (The whole continuation runs in tests/e2e/test_tito.py.)"""

from __future__ import annotations

from polar.proxy.tito import _identities


def call(call_id: str, arguments: str, name: str = "Create") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_a_call_resent_under_another_id_with_its_arguments_reformatted() -> None:
    answered = {"role": "assistant", "content": "\n\n",
                "tool_calls": [call("chatcmpl-tool-428c", '{"file_path": "a.txt", "content": "x"}')]}  # fmt: skip
    resent = {"role": "assistant", "content": None,
              "tool_calls": [call("call_chatcmpl-tool-428c_0", '{"content":"x","file_path":"a.txt"}')]}  # fmt: skip
    assert _identities(answered) & _identities(resent)


def test_other_calls_and_texts_do_not_match() -> None:
    one = {"role": "assistant", "tool_calls": [call("c1", '{"file_path": "a.txt"}')]}
    assert not _identities(one) & _identities({"role": "assistant", "tool_calls": [call("c2", '{"file_path": "b"}')]})
    assert not _identities(one) & _identities({"role": "assistant", "tool_calls": [call("c3", "{}", name="Read")]})
    assert _identities(one) & _identities({"role": "assistant", "tool_calls": [call("c1", "not json")]})  # same id
    assert _identities({"role": "assistant", "content": " done "}) == {("text", "done")}
    assert not _identities({"role": "assistant", "content": "done"}) & _identities(one)
