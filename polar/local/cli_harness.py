"""``polar harness install`` and ``polar harness check``: the coding-agent CLIs the presets drive."""

from __future__ import annotations

from pathlib import Path

import click

from polar.client import APIError


@click.group()
def harness() -> None:
    """Coding-agent CLIs the harness presets drive."""


@harness.command("install")
@click.argument("names", nargs=-1)
@click.option("--list", "show", is_flag=True, help="Show the installed versions instead.")
def harness_install(names: tuple[str, ...], show: bool) -> None:
    """Install the CLIs of presets NAME… into POLAR_HARNESS_CACHE (npm; a virtualenv of its own for a Python CLI);
    skips those already installed."""
    from polar.errors import PolarError
    from polar.harnesses.install import PACKAGES, cache_dir, install, installed

    if show:
        click.echo(f"cache: {cache_dir()}")
        for name, version in installed().items():
            click.echo(f"{name:15} {PACKAGES[name].spec():36} {version or '-'}")
        return
    if not names:
        raise click.UsageError(f"name at least one preset: {', '.join(PACKAGES)} (or --list)")
    try:
        versions = install(names)
    except PolarError as exc:
        raise click.ClickException(str(exc)) from exc
    for name, version in versions.items():
        click.echo(f"{name:15} {version}")


@harness.command("check")
@click.argument("name")
@click.option("--turns", default=None, type=click.IntRange(1, 500),
              help="Tool steps of the plan (default: 20, or the scenario's).")  # fmt: skip
@click.option("--tito", is_flag=True, help="Token-in-token-out on (token_in_token_out in the task).")
@click.option("--runtime", type=click.Choice(["local", "bwrap", "docker"]), default=None,
              help="Where the harness runs (default: the deployment's default runtime).")  # fmt: skip
@click.option("--command", "command", default=None, help="With NAME=command: the shell command ({instruction}).")
@click.option("--no-reasoning", is_flag=True, help="The model gives no reasoning block.")
@click.option("--long-output", default=None, type=click.IntRange(min=0),
              help="Lines every 'run' step prints (default: 0, or the scenario's).")  # fmt: skip
@click.option("--compaction", is_flag=True, help="Run the scenario that makes NAME compact its context.")
@click.option("--subagent", is_flag=True, help="Run the scenario that makes NAME spawn a sub-agent.")
@click.option("--json", "as_json", is_flag=True, help="End with one line of JSON: the session's segments.")
@click.option("--dir", "state_dir", default=".polar-check", show_default=True, type=click.Path(path_type=Path))
def harness_check(
    name: str, turns: int | None, tito: bool, runtime: str | None, command: str | None, no_reasoning: bool,
    long_output: int | None, compaction: bool, subagent: bool, as_json: bool, state_dir: Path,
) -> None:  # fmt: skip
    """Run NAME (a preset, or `command` with --command) on a multi-step plan and show how its calls chain: per
    call, chain extended or broken and why; per chain, the merge rate; per segment, its edge. Exits 1 when the
    session did not complete or a segment's edge is unexplained."""
    import json

    from polar.local.harness_check import COMPACTION, SUBAGENT, check_task, render, run_check

    if (name == "command") != (command is not None):
        raise click.UsageError("--command goes with NAME=command (and NAME=command needs --command)")
    if compaction and subagent:
        raise click.UsageError("--compaction and --subagent are two scenarios: run one at a time")
    scenario = None
    if compaction or subagent:
        known = COMPACTION if compaction else SUBAGENT
        if name not in known:
            what = "compaction" if compaction else "sub-agent"
            raise click.UsageError(f"no {what} scenario for {name!r}; there is one for: {', '.join(sorted(known))}")
        scenario = known[name]
    steps = turns or (scenario.turns if scenario else 20)
    task = check_task(name, steps, tito, runtime, command, scenario)
    policy = {"steps": steps, "reasoning": not no_reasoning, "long_output_lines": 0,
              **(dict(scenario.policy) if scenario else {})}  # fmt: skip
    if long_output is not None:
        policy["long_output_lines"] = long_output
    try:
        report = run_check(state_dir, task, policy, click.echo)
    except APIError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(render(report))
    if as_json:
        click.echo(json.dumps(report.as_json(name), separators=(",", ":")))
    if not report.ok:
        raise SystemExit(1)
