"""The ``command`` harness: ``{instruction}`` is replaced by the shell-quoted instruction, which is only safe where
the shell reads it as a word of its own. A template that puts it inside quotes, backticks, a here-document, a
comment or after a backslash lets an instruction out of its quoting: refused at submission, and not run by a worker
that meets one stored before."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from polar.contract.task_request import HarnessSpec
from polar.errors import ValidationError
from polar.harnesses.base import HarnessContext
from polar.harnesses.registry import HARNESSES, check_harness

UNSAFE = {
    'echo "{instruction}"': '"; touch {mark}; echo "',
    "echo '{instruction}'": "; touch {mark}; echo ",
    'sh -c "echo {instruction}"': "$(touch {mark})",
    "echo `echo {instruction}`": "`; touch {mark}; `",
    "echo \\{instruction}": "; touch {mark} #",
    "cat <<EOF\n{instruction}\nEOF": "$(touch {mark})",
    "true # {instruction}": "x\ntouch {mark}\n",
}
SAFE = [
    "echo {instruction}",
    "agent --task {instruction} --name \"x y\" --other 'z'",
    "cat <<'EOF' > notes.txt\nquoted 'text' here\nEOF\nagent {instruction}",
    'echo "a \\" b" {instruction} `date` $(echo "x")',
    "agent {instruction} # a comment",
    "echo <<< 'here string' {instruction}",
]


def _run(tmp_path: Path, template: str, instruction: str) -> subprocess.CompletedProcess[str]:
    session_dir = tmp_path / "session"
    (session_dir / "home").mkdir(parents=True, exist_ok=True)
    context = HarnessContext(
        session_id=uuid.uuid4(),
        task_id="t",
        instruction=instruction,
        spec=HarnessSpec(name="command", command=template),
        proxy_url="http://127.0.0.1:9",
        proxy_key="pk-test",
        session_dir=session_dir,
        runtime_env={},
    )
    launch = HARNESSES["command"].launch(context)
    return subprocess.run(
        launch.command, env=launch.env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )  # a hang guard


@pytest.mark.parametrize("template", list(UNSAFE))
def test_a_quoted_placeholder_is_refused_at_submission(template: str) -> None:
    with pytest.raises(ValidationError) as refused:
        check_harness(HarnessSpec(name="command", command=template), "tasks[0].harness")
    assert refused.value.field == "tasks[0].harness.command"
    assert refused.value.message.startswith(
        "tasks[0].harness.command: write {instruction} without quotes; Polar shell-quotes it"
    )


@pytest.mark.parametrize("template", list(UNSAFE))
def test_a_stored_quoted_template_runs_no_injection(tmp_path: Path, template: str) -> None:
    mark = tmp_path / "pwned"
    result = _run(tmp_path, template, UNSAFE[template].format(mark=mark))
    assert not mark.exists()
    assert result.returncode == 2 and "write {instruction} without quotes" in result.stderr


@pytest.mark.parametrize("template", SAFE)
def test_a_bare_placeholder_is_accepted_and_stays_one_word(tmp_path: Path, template: str) -> None:
    check_harness(HarnessSpec(name="command", command=template), "tasks[0].harness")
    mark = tmp_path / "pwned"
    for attack in {*UNSAFE.values()}:
        _run(tmp_path, template, attack.format(mark=mark))
    assert not mark.exists()
    tricky = 'it\'s "quoted" $(x) `y`\nz'
    assert _run(tmp_path, "printf %s {instruction}", tricky).stdout == tricky
