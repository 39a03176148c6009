"""Task loaders: JSONL rows, Jinja2 TaskRequest templates, SWE-bench instances, and the batch they make."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polar.agents.arithmetic import evaluate, format_number
from polar.contract.task_request import parse_batch_request
from polar.datasets import ARITHMETIC_ROWS, ARITHMETIC_TEMPLATE
from polar.errors import ValidationError
from polar.loaders import (
    Row,
    load_batch,
    make_batch,
    read_jsonl,
    read_mapping,
    swebench_instance,
    tasks_from_swebench,
    tasks_from_template,
)

TEMPLATE = """{
  "task_id": "q-{{ index }}",
  "instruction": {{ question | tojson }},
  "harness": {"name": "command", "command": "echo {{ row['the answer'] }}"},
  "metadata": {"answer": {{ row["the answer"] | tojson }}, "tags": {{ tags | tojson }}}
}"""

# A SWE-bench Lite row as the Hugging Face export has it: the test lists are JSON strings.
SWEBENCH_ROW: dict[str, Any] = {
    "repo": "astropy/astropy",
    "instance_id": "astropy__astropy-12907",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "patch": "diff --git a/astropy/modeling/separable.py b/astropy/modeling/separable.py\n--- a/...\n+++ b/...\n",
    "test_patch": "diff --git a/astropy/modeling/tests/test_separable.py b/astropy/modeling/tests/test_separable.py\n",
    "problem_statement": "Modeling's `separability_matrix` does not compute separability correctly for nested "
    "CompoundModels\nConsider the following model:\n\n```python\ncm = m.Linear1D(10) & m.Linear1D(5)\n```\n",
    "hints_text": "",
    "created_at": "2022-03-03T15:14:54Z",
    "version": "4.3",
    "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]", '
    '"astropy/modeling/tests/test_separable.py::test_separable[compound_model9-result9]"]',
    "PASS_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_coord_matrix"]',
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
}


def write_jsonl(path: Path, rows: list[Any], blank_after: int | None = None) -> Path:
    lines = [json.dumps(row) for row in rows]
    if blank_after is not None:
        lines.insert(blank_after, "")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_read_jsonl_numbers_rows_by_line_and_skips_blank_lines(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"a": 1}, {"a": 2}, {"a": 3}], blank_after=1)
    rows = read_jsonl(path)
    assert [(row.data["a"], row.where) for row in rows] == [(1, f"{path}:1"), (2, f"{path}:3"), (3, f"{path}:4")]
    assert [row.data["a"] for row in read_jsonl(path, limit=2)] == [1, 2]


@pytest.mark.parametrize(("line", "words"), [("{not json", "not JSON"), ("[1, 2]", "must be a JSON object, got list")])
def test_read_jsonl_names_the_bad_line(tmp_path: Path, line: str, words: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"a": 1}\n\n' + line + "\n")
    with pytest.raises(ValidationError) as caught:
        read_jsonl(path)
    assert str(caught.value).startswith(f"{path}:3: ") and words in str(caught.value)


def test_template_renders_fields_row_and_index_with_tojson_escaping() -> None:
    rows = [
        {"question": 'Say "hi"\nthen </stop> & go', "the answer": "hi", "tags": ["a", 1]},
        {"question": "two", "the answer": "2", "tags": []},
    ]
    tasks = tasks_from_template(rows, TEMPLATE)
    assert tasks[0] == {
        "task_id": "q-0",
        "instruction": 'Say "hi"\nthen </stop> & go',
        "harness": {"name": "command", "command": "echo hi"},
        "metadata": {"answer": "hi", "tags": ["a", 1]},
    }
    assert tasks[1]["task_id"] == "q-1" and tasks[1]["metadata"]["tags"] == []


def test_template_undefined_variable_names_the_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "a", "the answer": 1, "tags": []}, {"question": "b"}])
    with pytest.raises(ValidationError) as caught:
        tasks_from_template(read_jsonl(path), TEMPLATE)
    assert str(caught.value).startswith(f"{path}:2: template: undefined variable")
    assert caught.value.field == f"{path}:2"


def test_template_rendering_invalid_json_names_the_line_and_shows_the_fix(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "fine"}, {"q": 'has "quotes"'}])
    with pytest.raises(ValidationError) as caught:
        tasks_from_template(read_jsonl(path), '{"task_id": "x",\n "instruction": "{{ q }}"}')
    message = str(caught.value)
    assert message.startswith(f"{path}:2: the rendered template is not valid JSON")
    assert "rendered line 2" in message and "tojson" in message


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ('{"a": {{ x }', "template:1: template syntax error"),
        ("[{{ x | tojson }}]", "row 1: the template must render a JSON object"),
        ('{"a": {{ x.missing.deeper }}}', "row 1: template: undefined variable"),
        ('{"a": {{ x + 1 }}}', "row 1: template: cannot render"),
        ('{"a": {{ x.__class__.__mro__ | tojson }}}', "row 1: template"),
    ],
)
def test_template_errors_are_validation_errors(template: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        tasks_from_template([{"x": "text"}], template)
    assert str(caught.value).startswith(words)


def test_swebench_row_becomes_a_docker_task_graded_by_swebench() -> None:
    (task,) = tasks_from_swebench([Row(SWEBENCH_ROW, "lite.jsonl:1")])
    instance = task["evaluator"]["config"]["instance"]
    assert task["task_id"] == "astropy__astropy-12907"
    assert task["instruction"] == SWEBENCH_ROW["problem_statement"]
    # SWE-bench's published name: lower case, "__" spelled "_1776_" (Docker Hub forbids double underscores).
    assert task["runtime"] == {
        "backend": "docker",
        "image": "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest",
        "workdir": "/testbed",
    }
    assert task["evaluator"]["name"] == "swebench" and task["evaluator"]["config"]["repo_dir"] == "/testbed"
    assert instance["FAIL_TO_PASS"] == json.loads(SWEBENCH_ROW["FAIL_TO_PASS"])
    assert instance["PASS_TO_PASS"] == ["astropy/modeling/tests/test_separable.py::test_coord_matrix"]
    assert {k: v for k, v in instance.items() if k not in {"FAIL_TO_PASS", "PASS_TO_PASS"}} == {
        k: v for k, v in SWEBENCH_ROW.items() if k not in {"FAIL_TO_PASS", "PASS_TO_PASS"}
    }
    assert task["metadata"] == {"instance_id": "astropy__astropy-12907", "repo": "astropy/astropy", "version": "4.3"}


def test_swebench_gym_rows_with_lists_own_images_and_an_image_template() -> None:
    gym = {**SWEBENCH_ROW, "instance_id": "Project-MONAI__MONAI-1010", "FAIL_TO_PASS": ["t::a"], "PASS_TO_PASS": []}
    own = {**SWEBENCH_ROW, "image": "registry.example/own:1"}
    unversioned = {k: v for k, v in SWEBENCH_ROW.items() if k != "version"}
    tasks = tasks_from_swebench([gym, own, {**SWEBENCH_ROW, "version": 3.0}, unversioned])
    assert tasks[0]["runtime"]["image"] == "swebench/sweb.eval.x86_64.project-monai_1776_monai-1010:latest"
    assert tasks[0]["evaluator"]["config"]["instance"]["FAIL_TO_PASS"] == ["t::a"]
    assert tasks[1]["runtime"]["image"] == "registry.example/own:1"
    assert tasks[2]["metadata"]["version"] == "3.0"
    assert tasks[3]["metadata"] == {"instance_id": "astropy__astropy-12907", "repo": "astropy/astropy"}
    gym_template = "xingyaoww/sweb.eval.x86_64.{{ instance_id | replace('__', '_s_') | lower }}"
    (templated,) = tasks_from_swebench([own], image_template=gym_template)
    assert templated["runtime"]["image"] == "xingyaoww/sweb.eval.x86_64.astropy_s_astropy-12907"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"problem_statement": None}, "missing problem_statement"),
        ({"FAIL_TO_PASS": None, "test_patch": None}, "missing test_patch, FAIL_TO_PASS"),
        ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS: is empty"),
        ({"FAIL_TO_PASS": "[not json"}, "FAIL_TO_PASS: not a JSON list"),
        ({"PASS_TO_PASS": '{"a": 1}'}, "PASS_TO_PASS: must be a list of test names"),
        ({"repo": ""}, "repo: must be a non-empty string"),
        ({"version": ["4.3"]}, "version: must be a string"),
    ],
)
def test_swebench_bad_rows_name_the_line(tmp_path: Path, change: dict[str, Any], words: str) -> None:
    row = {k: v for k, v in {**SWEBENCH_ROW, **change}.items() if v is not None}
    path = write_jsonl(tmp_path / "swe.jsonl", [SWEBENCH_ROW, row])
    with pytest.raises(ValidationError) as caught:
        tasks_from_swebench(read_jsonl(path))
    assert str(caught.value).startswith(f"{path}:2: ") and words in str(caught.value)


def test_swebench_instance_leaves_the_row_untouched() -> None:
    row = Row(dict(SWEBENCH_ROW), "x:1")
    swebench_instance(row)
    assert row.data == SWEBENCH_ROW


def test_swebench_batch_takes_the_harness_from_defaults(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "swe.jsonl", [SWEBENCH_ROW, {**SWEBENCH_ROW, "instance_id": "astropy__astropy-2"}])
    with pytest.raises(ValidationError) as caught:
        load_batch(path, swebench=True)
    assert str(caught.value).startswith(f"{path}:1: harness: required field is missing")
    assert "defaults" in str(caught.value)
    defaults = {
        "harness": {"name": "claude_code"},
        "timeout_seconds": 3600,
        "runtime": {"prepare": [{"run": "git status"}], "limits": {"cpus": 2}},
    }
    batch = load_batch(path, swebench=True, defaults=defaults, samples=3, limit=1)
    assert batch["name"] == "swe" and batch["defaults"] == defaults and len(batch["tasks"]) == 1
    (task,) = parse_batch_request(batch).tasks
    assert task.harness.name == "claude_code" and task.timeout_seconds == 3600 and task.num_samples == 3
    assert task.runtime.backend == "docker" and task.runtime.image is not None
    assert task.runtime.prepare[0].run == "git status" and task.runtime.limits.cpus == 2  # type: ignore[union-attr]


def test_template_batch_validation_errors_name_the_row(tmp_path: Path) -> None:
    template = tmp_path / "t.json"
    template.write_text('{"task_id": {{ id | tojson }}, "instruction": "x", "num_samples": {{ n | tojson }}}')
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "n": 1}, {"id": "b", "n": "two"}])
    defaults = {"harness": {"name": "command", "command": "true"}}
    with pytest.raises(ValidationError) as caught:
        load_batch(path, template=template, defaults=defaults)
    assert str(caught.value).startswith(f"{path}:2: num_samples: ")
    assert caught.value.field == f"{path}:2"
    batch = load_batch(path, template=template, defaults=defaults, samples=2, name="mine")
    assert batch["name"] == "mine" and [t["num_samples"] for t in batch["tasks"]] == [2, 2]


def test_a_batch_file_still_loads_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "batch.yaml"
    path.write_text(
        "name: file-name\ncallback_url: http://127.0.0.1:9/cb\ndefaults:\n  harness: {name: command, command: 'true'}\n"
        "  timeout_seconds: 30\ntasks:\n  - {task_id: a, instruction: x}\n  - {task_id: b, instruction: y}\n"
    )
    assert load_batch(path)["name"] == "file-name"
    batch = load_batch(path, defaults={"timeout_seconds": 60}, limit=1, samples=2, name="n")
    assert batch == {
        "callback_url": "http://127.0.0.1:9/cb",
        "name": "n",
        "defaults": {"harness": {"name": "command", "command": "true"}, "timeout_seconds": 60},
        "tasks": [{"task_id": "a", "instruction": "x", "num_samples": 2}],
    }


def test_no_rows_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValidationError, match="no tasks"):
        load_batch(path, template=ARITHMETIC_TEMPLATE)
    with pytest.raises(ValidationError, match="not both"):
        load_batch(path, template=ARITHMETIC_TEMPLATE, swebench=True)
    with pytest.raises(ValidationError, match="no tasks"):
        make_batch([])


def test_read_mapping_reads_json_yaml_files_and_inline_json(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text("harness:\n  name: codex\n")
    (tmp_path / "d.json").write_text('{"timeout_seconds": 5}')
    assert read_mapping(tmp_path / "d.yaml", "--defaults") == {"harness": {"name": "codex"}}
    assert read_mapping(str(tmp_path / "d.json"), "--defaults") == {"timeout_seconds": 5}
    assert read_mapping(' {"num_samples": 2}', "--defaults") == {"num_samples": 2}
    for bad, words in [("{nope", "not valid JSON"), (str(tmp_path / "missing.json"), "cannot read")]:
        with pytest.raises(ValidationError, match=words):
            read_mapping(bad, "--defaults")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ValidationError, match="must be a JSON/YAML object"):
        read_mapping(tmp_path / "list.yaml", "--defaults")


def test_the_shipped_arithmetic_dataset_and_template_make_valid_tasks() -> None:
    rows = read_jsonl(ARITHMETIC_ROWS)
    assert len(rows) == 10 and len({row.data["id"] for row in rows}) == 10
    for row in rows:
        assert row.data["answer"] == format_number(evaluate(row.data["expression"]))
    batch = load_batch(ARITHMETIC_ROWS, template=ARITHMETIC_TEMPLATE, samples=2)
    request = parse_batch_request(batch)
    assert request.num_sessions == 20 and batch["name"] == "arithmetic"
    first = request.tasks[0]
    assert first.task_id == "arith-00" and first.instruction.startswith("What is 17 * 23?")
    assert first.harness.command == "polar.agents.calculator:run"
    assert first.evaluator.name == "test_on_output"
    assert first.evaluator.config == {
        "answer": {"expected": "391", "match": "numeric", "pattern": "answer is\\s*(-?[\\d.,]+)"}
    }
    assert first.metadata == {"expression": "17 * 23", "expected": "391"}
