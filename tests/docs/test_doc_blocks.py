"""Every code block in the README and docs/ is checked against the code it documents (SQL blocks are executed by
``test_sql_doc.py``): each ``polar`` command line parses with the CLI's own parser (subcommands, options, choices),
each ``make`` target exists, each ``celery -A`` / ``gunicorn`` app imports, each task request validates as the API
would validate it, Python compiles and imports what it names, YAML and TOML parse."""

from __future__ import annotations

import ast
import importlib
import json
import re
import shlex
import tomllib
import warnings
from pathlib import Path

import click
import pytest
import yaml

from polar.contract.task_request import parse_batch_request
from polar.local.cli import main as polar_cli
from tests.doc_blocks import ROOT, blocks

# Programs the docs may name besides polar/make/celery/gunicorn: the shell's and the system's own.
KNOWN = {"curl", "python", "docker", "export", "schemathesis", "crontab", "psql", "grep"}


def bodies(*languages: str) -> list[tuple[str, str]]:
    return [(block.where, block.body) for block in blocks(*languages)]


def commands(body: str) -> list[list[str]]:
    """The commands of a shell block: continuations joined, comments and trailing ``&`` dropped, pipelines split."""
    joined = body.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words and words[-1] == "&":
            words = words[:-1]
        while words:
            if "|" in words:
                cut = words.index("|")
                found.append(words[:cut])
                words = words[cut + 1 :]
            else:
                found.append(words)
                words = []
    return [c for c in found if c]


def check_polar(args: list[str], workdir: Path) -> None:
    """Parse ``polar ARGS`` exactly as the CLI would, without running it (files it names exist, empty, in
    ``workdir``, and the directory after ``--harbor``: the parser checks existence, not content)."""
    for before, word in zip(["", *args], args, strict=False):
        if re.fullmatch(r"[\w./-]+\.(json|jsonl|yaml|yml|parquet)", word) and not word.startswith("/"):
            (workdir / word).parent.mkdir(parents=True, exist_ok=True)
            (workdir / word).touch()
        elif before == "--harbor" and not word.startswith("/"):  # a directory of task folders
            (workdir / word).mkdir(parents=True, exist_ok=True)
    command: click.Command = polar_cli
    context = command.make_context("polar", list(args), resilient_parsing=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # click 8.2 renames protected_args; both work
        while isinstance(command, click.Group) and context.protected_args + context.args:
            name, sub, rest = command.resolve_command(context, [*context.protected_args, *context.args])
            assert sub is not None, f"no polar command {name!r}"
            command, context = sub, sub.make_context(name or "", rest, parent=context)


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def check_app(path: str) -> None:
    module, _, attr = path.partition(":")
    loaded = importlib.import_module(module)
    if attr:
        assert hasattr(loaded, attr.removesuffix("()")), path


@pytest.mark.parametrize(("where", "body"), bodies("bash", "sh"), ids=[w for w, _ in bodies("bash", "sh")])
def test_every_documented_command_is_one_the_code_accepts(
    where: str, body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for words in commands(body):
        program = words[0].removeprefix(".venv/bin/")
        if program == "polar":
            check_polar(words[1:], tmp_path)
        elif program == "make":
            assert set(words[1:]) <= make_targets(), f"{where}: {words}"
        elif program == "celery":
            check_app(words[words.index("-A") + 1])
        elif program == "gunicorn":
            check_app(words[-1])
        else:
            assert program in KNOWN, f"{where}: unknown program {program!r} in {words}"


@pytest.mark.parametrize(("where", "body"), bodies("json"), ids=[w for w, _ in bodies("json")])
def test_every_json_block_parses_and_task_requests_validate(where: str, body: str) -> None:
    value = json.loads(body)
    if isinstance(value, dict) and "tasks" in value:
        parse_batch_request(value)


@pytest.mark.parametrize(("where", "body"), bodies("python"), ids=[w for w, _ in bodies("python")])
def test_every_python_block_compiles_and_its_imports_exist(where: str, body: str) -> None:
    tree = ast.parse(body)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "polar":
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{where}: {node.module}.{alias.name}"


@pytest.mark.parametrize(("where", "body"), bodies("yaml"), ids=[w for w, _ in bodies("yaml")])
def test_every_yaml_block_parses(where: str, body: str) -> None:
    assert yaml.safe_load(body) is not None


@pytest.mark.parametrize(("where", "body"), bodies("toml"), ids=[w for w, _ in bodies("toml")])
def test_every_toml_block_parses(where: str, body: str) -> None:
    assert tomllib.loads(body)
