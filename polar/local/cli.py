"""The ``polar`` command: flags are parsed here and everything else is called in ``polar``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import click

from polar.client import APIError, PolarClient, configured_client
from polar.config import load_config
from polar.local import cli_engine, cli_harness, cli_views


@click.group()
def main() -> None:
    """Polar: RL and SFT rollouts over unmodified agent harnesses."""


@main.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Apply the migrations to POLAR_DATABASE_URL."""
    from polar.storage.migration import upgrade

    config = load_config()
    upgrade(config.database_url, revision)
    click.echo(f"migrated to {revision}")


@main.group()
def node() -> None:
    """Worker nodes: drain one before taking it away (docs/operations.md)."""


@node.command("drain")
@click.argument("name")
def node_drain(name: str) -> None:
    """No new work on node NAME: admission stops counting its READY bound and its init workers take no session;
    what it holds finishes. A drained node holding nothing is not judged lost when its workers stop."""
    _set_drained(name, True)


@node.command("undrain")
@click.argument("name")
def node_undrain(name: str) -> None:
    """Take node NAME back after ``polar node drain``."""
    _set_drained(name, False)


def _set_drained(name: str, drained: bool) -> None:
    from polar.lifecycle.nodes import drain
    from polar.storage.database import open_database

    database = open_database(load_config(), "node")
    try:
        with database.unit() as db:
            found = drain(db, name, drained)
    finally:
        database.dispose()
    if not found:
        raise click.ClickException(f"no node named {name!r} has registered (POLAR_NODE of its workers)")
    click.echo(f"node {name} {'drained: no new work there' if drained else 'takes work again'}")


@main.command()
@click.option("--older-than", required=True, help="Batches that finished longer ago than this: 30d, 12h, 90m, 2w.")
@click.option("--keep-trajectories", is_flag=True,
              help="Keep batches, sessions and trajectories; empty the calls' captured bodies (each session's "
                   "last successful call stays whole, for the SFT export).")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Only count what would go.")
def gc(older_than: str, keep_trajectories: bool, dry_run: bool) -> None:
    """Delete what batches that finished before the cutoff captured (POLAR_DATABASE_URL), in bounded
    transactions; safe to interrupt and run again."""
    from polar.errors import ValidationError
    from polar.records.retention import RetentionPolicy, collect_garbage, parse_age
    from polar.storage.database import open_database

    try:
        policy = RetentionPolicy(parse_age(older_than), keep_trajectories=keep_trajectories, dry_run=dry_run)
    except ValidationError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from exc

    def report(batch_id: Any, done: Any, finished: bool) -> None:
        if finished:
            click.echo(f"{policy.verb} batch {batch_id}: {done.describe(keep_trajectories)}")
        else:
            click.echo(f"  batch {batch_id}, so far: {done.describe(keep_trajectories)}", err=True)

    database = open_database(load_config(), "gc")
    try:
        total = collect_garbage(database, policy, report)
    finally:
        database.dispose()
    if not total.batches:
        click.echo(f"nothing to {'strip' if keep_trajectories else 'delete'}: no batch finished more than "
                   f"{older_than} ago")  # fmt: skip
        return
    batches = f"{total.batches} batch" + ("es" if total.batches > 1 else "")
    click.echo(f"{policy.verb} {batches}: {total.describe(keep_trajectories)}")


def _client(api: str | None, token: str | None) -> PolarClient:
    return configured_client(api, token)


def _token_lines(given: str | None, generated: str) -> list[str]:
    """How to reach an embedded API: the token it was given is not echoed; a generated one is, once."""
    if given:
        return ["  API token: POLAR_API_TOKEN (from the environment)"]
    return [
        "  API token (generated for this run; clients send 'Authorization: Bearer <token>'):",
        f"  export POLAR_API_TOKEN={generated}",
    ]


def _progress_printer(total_hint: int | None = None) -> Any:
    bar: dict[str, Any] = {}

    def show(status: dict[str, Any]) -> None:
        counts = status["counts"]
        total = status.get("num_sessions") or total_hint or sum(counts.values())
        done = sum(counts.get(s, 0) for s in ("completed", "failed", "timed_out", "cancelled"))
        if "bar" not in bar:
            bar["bar"] = click.progressbar(length=total, label="sessions", show_pos=True, file=sys.stderr)
            bar["bar"].__enter__()
            bar["done"] = 0
        bar["bar"].update(done - bar["done"])
        bar["done"] = done
        if done >= total:
            bar["bar"].__exit__(None, None, None)

    return show


def _batch_source(command: Callable[..., None]) -> Callable[..., None]:
    """The options that say how a data file becomes a batch (``polar submit`` and ``polar generate``)."""
    options = [
        click.option("--template", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                     help="The data file is JSONL; each row becomes a task through this Jinja2 TaskRequest template."),
        click.option("--swebench", is_flag=True, help="The data file is SWE-bench-format JSONL (one instance a line)."),
        click.option("--image-template", default=None,
                     help="With --swebench: each instance's image, Jinja2 over the row's fields "
                          "(default: the row's image, else SWE-bench's published name)."),
        click.option("--defaults", default=None,
                     help="Batch defaults merged under every task (harness, timeout, prepare ...): "
                          "a JSON/YAML file or inline JSON."),
        click.option("--samples", type=click.IntRange(min=1), default=None,
                     help="Samples per task (overrides the tasks' num_samples)."),
        click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N rows (or tasks)."),
        click.option("--name", default=None, help="Batch name (default: the data file's name without suffix)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def _load_batch(file: Path, source: dict[str, Any]) -> dict[str, Any]:
    from polar.errors import ValidationError
    from polar.loaders import load_batch, read_mapping

    if source["template"] and source["swebench"]:
        raise click.UsageError("give --template or --swebench, not both")
    if source["image_template"] and not source["swebench"]:
        raise click.UsageError("--image-template goes with --swebench")
    try:
        defaults = read_mapping(source["defaults"], "--defaults") if source["defaults"] else None
        return load_batch(
            file,
            template=source["template"],
            swebench=source["swebench"],
            image_template=source["image_template"],
            defaults=defaults,
            samples=source["samples"],
            limit=source["limit"],
            name=source["name"],
        )
    except ValidationError as exc:
        raise click.ClickException(str(exc)) from exc


def _load_harbor(directory: Path, harnesses: tuple[str, ...], source: dict[str, Any]) -> dict[str, Any]:
    from polar.errors import PolarError
    from polar.loaders import load_harbor, read_mapping

    if source["template"] or source["swebench"] or source["image_template"]:
        raise click.UsageError("--harbor takes no --template, --swebench or --image-template")
    default = [name for name in harnesses if "=" not in name]
    if len(default) > 1:
        raise click.UsageError(f"one default --harness at most (got {', '.join(default)}); use TASK=NAME for others")
    per_task = dict(name.split("=", 1) for name in harnesses if "=" in name)
    try:
        defaults = read_mapping(source["defaults"], "--defaults") if source["defaults"] else None
        return load_harbor(
            directory, harness=default[0] if default else None, per_task=per_task, defaults=defaults,
            samples=source["samples"], limit=source["limit"], name=source["name"],
        )  # fmt: skip
    except PolarError as exc:
        raise click.ClickException(str(exc)) from exc


@main.command()
@click.argument("file", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_batch_source
@click.option("--harbor", "harbor_dir", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Submit the Harbor task folder DIR, or every task folder under it, as one batch (each "
                   "environment built into a local Docker image).")  # fmt: skip
@click.option("--harness", "harnesses", multiple=True, metavar="NAME|TASK=NAME",
              help="With --harbor: the harness of every task (oracle: each task's solution/solve.sh); TASK=NAME "
                   "gives one task folder its own. Repeatable.")  # fmt: skip
@click.option("--wait", is_flag=True, help="Wait for the batch to finish, with a progress bar.")
@click.option("--api", default=None, help="Rollout API URL (default POLAR_API_URL).")
@click.option("--token", default=None, help="API token (default POLAR_API_TOKEN).")
@click.option("--idempotency-key", default=None,
              help="Send this Idempotency-Key: a second submit with it returns the first's batch (default: a fresh "
                   "key for this command, which its own retries reuse).")  # fmt: skip
def submit(
    file: Path | None, harbor_dir: Path | None, harnesses: tuple[str, ...], wait: bool, api: str | None,
    token: str | None, idempotency_key: str | None, **source: Any,
) -> None:  # fmt: skip
    """Submit a batch: FILE is a JSON or YAML batch, or JSONL rows with --template or --swebench; or --harbor DIR."""
    if (file is None) == (harbor_dir is None):
        raise click.UsageError("give FILE or --harbor DIR (one of them)")
    if harnesses and harbor_dir is None:
        raise click.UsageError("--harness goes with --harbor (a batch file names its harnesses)")
    batch = _load_batch(file, source) if file is not None else _load_harbor(harbor_dir, harnesses, source)  # type: ignore[arg-type]
    client = _client(api, token)
    try:
        submitted = client.submit(batch, idempotency_key)
        click.echo(json.dumps(submitted))
        if wait:
            final = client.wait(submitted["batch_id"], on_progress=_progress_printer(submitted["num_sessions"]))
            click.echo(json.dumps(final["counts"]))
    except APIError as exc:
        raise click.ClickException(str(exc)) from exc


@contextlib.contextmanager
def _api(
    api: str | None, token: str | None, embedded: bool, state_dir: Path, concurrency: int
) -> Iterator[PolarClient]:
    """A client of the given API, or of a whole stack on embedded defaults started for the command's duration."""
    if not embedded:
        with contextlib.closing(_client(api, token)) as client:
            yield client
        return
    from polar.local.embedded import embedded_stack

    if api:
        raise click.UsageError("--embedded starts its own API; leave out --api")
    deployment, stack = embedded_stack(state_dir, concurrency, api_token=token or load_config().api_token)
    click.echo(f"starting engine, API, proxy and two worker pools (logs in {stack.log_dir}) ...", err=True)
    with stack, contextlib.closing(PolarClient(deployment.api_url, deployment.api_token)) as client:
        yield client


@main.command("generate")
@click.argument("data", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_batch_source
@click.option("--min-reward", type=float, default=1.0, show_default=True, help="Keep sessions with reward >= this.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The SFT file (default sft.FORMAT).")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["jsonl", "parquet"]), default="jsonl", show_default=True)
@click.option("--api", default=None, help="Rollout API URL (default POLAR_API_URL).")
@click.option("--token", default=None, help="API token (default POLAR_API_TOKEN).")
@click.option("--embedded", is_flag=True, help="Run on embedded defaults, as polar demo does (no services needed).")
@click.option("--dir", "state_dir", default=".polar", show_default=True, type=click.Path(path_type=Path),
              help="With --embedded: the state directory.")  # fmt: skip
@click.option("--run-concurrency", default=4, show_default=True, type=int, help="With --embedded.")
def generate_command(
    data: Path,
    min_reward: float,
    out: Path | None,
    fmt: Literal["jsonl", "parquet"],
    api: str | None,
    token: str | None,
    embedded: bool,
    state_dir: Path,
    run_concurrency: int,
    **source: Any,
) -> None:
    """Offline SFT generation: run DATA's tasks, keep the sessions with reward >= --min-reward, write them as SFT
    conversations, and print attempts, accepted, acceptance rate, tokens and wall time."""
    from polar.local.generate import generate

    batch = _load_batch(data, source)
    with _api(api, token, embedded, state_dir, run_concurrency) as client:
        try:
            result = generate(client, batch, out or Path(f"sft.{fmt}"), fmt, min_reward, _progress_printer())
        except APIError as exc:
            status = f" (HTTP {exc.status})" if exc.status else ""
            raise click.ClickException(f"{exc.message}{status}") from exc
    click.echo(result.table())


@main.command("export")
@click.argument("batch_id")
@click.option("--kind", type=click.Choice(["rl", "sft"]), default="rl", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["jsonl", "parquet"]), default="jsonl", show_default=True)
@click.option("--min-reward", type=float, default=None, help="Keep only sessions with reward >= this.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Output file (default BATCH_ID-KIND.FORMAT).")  # fmt: skip
@click.option("--api", default=None)
@click.option("--token", default=None)
def export_batch(
    batch_id: str, kind: str, fmt: str, min_reward: float | None, out: Path | None, api: str | None, token: str | None
) -> None:
    """Download a batch as RL trajectories or SFT conversations (JSONL or Parquet)."""
    path = out or Path(f"{batch_id}-{kind}.{fmt}")
    try:
        summary = _client(api, token).download(batch_id, kind, fmt, min_reward, path)
    except APIError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"{summary['sessions']} sessions, {summary['accepted']} accepted "
        f"(acceptance rate {summary['acceptance_rate']:.1%}), {summary['rows']} rows, {summary['tokens']} tokens"
    )
    click.echo(f"written to {path}")


_engine_option = click.option(
    "--engine",
    type=click.Choice(["reference", "vllm"]),
    default="reference",
    show_default=True,
    help="reference: Polar's reference engine; vllm: real vLLM (polar engine --backend vllm, held to the same "
    "policy; install it first with `polar engine --backend vllm --install`).",
)


def _backend(engine: str) -> Literal["policy", "vllm"]:
    return "vllm" if engine == "vllm" else "policy"


def _engine_name(engine: str) -> str:
    return "real vLLM" if engine == "vllm" else "the reference engine"


@main.command()
@click.option("--dir", "state_dir", default=".polar", show_default=True, type=click.Path(path_type=Path))
@click.option("--run-concurrency", default=4, show_default=True, type=int)
@_engine_option
def up(state_dir: Path, run_concurrency: int, engine: str) -> None:
    """Run everything on embedded defaults and stay up (Ctrl-C stops)."""
    from polar.local.embedded import embedded_stack
    from polar.local.launcher import metrics_urls

    given = load_config().api_token
    deployment, stack = embedded_stack(state_dir, run_concurrency, api_token=given, engine_backend=_backend(engine))
    stack.start()
    stack.supervise()  # a process that exits (a worker on a broker hiccup) is restarted, as a service manager would
    lines = [
        f"Polar is up: API {deployment.api_url}  proxy http://127.0.0.1:{deployment.ports['proxy']}",
        f"  engine http://127.0.0.1:{deployment.ports['engine']}  logs {stack.log_dir}",
        f"  metrics (docs/metrics.md): {deployment.api_url}/metrics (token)  proxy /metrics  workers "
        + " ".join(metrics_urls(list(stack.specs.values())).values()),
        f"  export POLAR_API_URL={deployment.api_url}",
        *_token_lines(given, deployment.api_token),
    ]
    click.echo("\n".join(lines))  # one write: whoever waits for "Polar is up" finds the token with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        reported = 0
        while True:
            for name, status in stack.restarts[reported:]:
                click.echo(f"{name} exited ({status}) and was restarted; see {stack.log(name)}", err=True)
            reported = len(stack.restarts)
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()


@main.command()
@click.option("--dir", "state_dir", default=".polar", show_default=True, type=click.Path(path_type=Path))
@click.option("--tasks", default=8, show_default=True, type=click.IntRange(1, 10), help="Rows of the dataset.")
@click.option("--samples", default=4, show_default=True, type=click.IntRange(min=1))
@click.option("--out", default="demo-trajectories.jsonl", show_default=True, type=click.Path(path_type=Path))
@click.option("--run-concurrency", default=4, show_default=True, type=int)
@_engine_option
def demo(state_dir: Path, tasks: int, samples: int, out: Path, run_concurrency: int, engine: str) -> None:
    """Run the arithmetic demo end to end on embedded defaults."""
    from polar.local.demo import run_demo
    from polar.local.embedded import embedded_stack

    given = load_config().api_token
    deployment, stack = embedded_stack(state_dir, run_concurrency, api_token=given, engine_backend=_backend(engine))
    click.echo(f"starting {_engine_name(engine)}, API, proxy and two worker pools (logs in {stack.log_dir}) ...")
    click.echo("\n".join(_token_lines(given, deployment.api_token)))
    started = time.monotonic()
    with stack, contextlib.closing(PolarClient(deployment.api_url, deployment.api_token)) as client:
        try:
            rows = run_demo(client, tasks, samples, out, _progress_printer(tasks * samples))
        except APIError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(f"\n{'task':<10} {'expression':<20} {'expected':>9} {'correct':>8}  rewards")
    for row in rows:
        rewards = " ".join("-" if r is None else f"{r:.1f}" for r in row["rewards"])
        click.echo(f"{row['task_id']:<10} {row['expression']:<20} {row['expected']:>9} "
                   f"{row['correct']:>4}/{len(row['rewards']):<3}  {rewards}")  # fmt: skip
    states = [s for row in rows for s in row["states"]]
    correct = sum(row["correct"] for row in rows)
    elapsed = time.monotonic() - started
    click.echo(f"\n{len(states)} sessions, {states.count('completed')} completed, {correct} correct, in {elapsed:.1f}s")
    click.echo(f"trajectories written to {out}")
    if states.count("completed") != len(states):
        raise click.ClickException("some sessions did not complete; see the logs above")


@main.command("gym-agent")
@click.option(
    "--template",
    "template_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The task each dataset row becomes: a TaskRequest as JSON with Jinja2 (variables: the row's fields, row, "
    "instruction).",
)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on; NeMo RL's nodes must reach it (docs/nemo-gym.md).")  # fmt: skip
@click.option("--port", default=8500, show_default=True, type=int)
@click.option("--allow-from", "allow_from", multiple=True, metavar="CIDR",
              help="Answer only callers from this network (repeatable; replaces the default: loopback only). "
              "Others get 403.")  # fmt: skip
@click.option("--require-token", is_flag=True,
              help="Also require 'Authorization: Bearer <POLAR_API_TOKEN>' (401 otherwise). NeMo Gym 0.7's own "
              "client sends none.")  # fmt: skip
@click.option("--threads", default=8, show_default=True, type=click.IntRange(1, 256),
              help="Threads for Postgres and submission work (waiting rows hold none).")  # fmt: skip
@click.option("--poll", "poll_s", default=0.25, show_default=True, type=click.FloatRange(0.01, 60),
              help="Seconds between the checks of which waiting rows have settled.")  # fmt: skip
@click.option("--all-chains", is_flag=True,
              help="Answer every call of a session, side calls included (a title request, a tool's own use of the "
              "session's key); by default only its main chain's (docs/training-data.md).")  # fmt: skip
def gym_agent(template_path: Path, host: str, port: int, allow_from: tuple[str, ...], require_token: bool,
              threads: int, poll_s: float, all_chains: bool) -> None:  # fmt: skip
    """Serve NeMo Gym's agent contract (POST /run) over this deployment (docs/nemo-gym.md). It answers only
    callers from --allow-from (default: loopback), and with --require-token only those with the API token."""
    import ipaddress

    from polar.loaders.template import compile_template

    compile_template(template_path.read_text(), str(template_path))  # a syntax error is reported here, plainly
    for cidr in allow_from:  # reported here, plainly, as the template is
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            message = f"{cidr!r} is not an address or CIDR network ({exc})"
            raise click.BadParameter(message, param_hint="--allow-from") from exc
    if require_token and not (load_config().api_token or "").strip():
        raise click.UsageError("--require-token needs POLAR_API_TOKEN set (the token callers must send)")
    args = ["--template", str(template_path), "--host", host, "--port", str(port), "--threads", str(threads)]
    args += [f"--allow-from={cidr}" for cidr in allow_from] + (["--require-token"] if require_token else [])
    # The server is a web process (web.gym); the domain CLI names it by module, as the launcher names gunicorn apps.
    args += ["--all-chains"] if all_chains else []
    os.execv(sys.executable, [sys.executable, "-m", "web.gym", *args, "--poll", str(poll_s)])


# polar engine, polar harness install / check, polar status / logs / open
for _command in (cli_engine.engine, cli_harness.harness, cli_views.status, cli_views.logs, cli_views.open_console):
    main.add_command(_command)
