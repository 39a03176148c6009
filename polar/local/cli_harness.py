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
@click.option("--turns", default=20, show_default=True, type=click.IntRange(1, 500), help="Tool steps of the plan.")
@click.option("--tito", is_flag=True, help="Token-in-token-out on (token_in_token_out in the task).")
@click.option("--runtime", type=click.Choice(["local", "bwrap", "docker"]), default=None,
              help="Where the harness runs (default: the deployment's default runtime).")  # fmt: skip
@click.option("--command", "command", default=None, help="With NAME=command: the shell command ({instruction}).")
@click.option("--no-reasoning", is_flag=True, help="The model gives no reasoning block.")
@click.option("--long-output", default=0, show_default=True, type=click.IntRange(min=0),
              help="Lines every 'run' step prints (to trigger the harness's compaction).")  # fmt: skip
@click.option("--dir", "state_dir", default=".polar-check", show_default=True, type=click.Path(path_type=Path))
def harness_check(
    name: str, turns: int, tito: bool, runtime: str | None, command: str | None, no_reasoning: bool,
    long_output: int, state_dir: Path,
) -> None:  # fmt: skip
    """Run NAME (a preset, or `command` with --command) on a multi-step plan and show how its calls chain: per
    call, chain extended or broken and why; per chain, the merge rate. Exits 1 when the session did not complete
    or a break is unexplained."""
    from polar.local.harness_check import check_task, render, run_check

    if (name == "command") != (command is not None):
        raise click.UsageError("--command goes with NAME=command (and NAME=command needs --command)")
    task = check_task(name, turns, tito, runtime, command)
    policy = {"steps": turns, "reasoning": not no_reasoning, "long_output_lines": long_output}
    try:
        report = run_check(state_dir, task, policy, click.echo)
    except APIError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(render(report))
    if not report.ok:
        raise SystemExit(1)
