"""``polar status``, ``polar logs`` and ``polar open``: a batch and a session as an operator reads them in a
terminal, through the rollout API (``polar.client``).

    polar status BATCH [--watch] [--interval 2] [--json]   sessions by stage and state (live with --watch)
    polar logs SESSION [--json]                            state changes with times and durations, then error / output
    polar open BATCH [--browser]                           the console page: <api>/ui/batches/<id>

The rendering functions are pure (a status or session dict in, text out) so a test can read what a person sees.
"""

from __future__ import annotations

import json
import sys
import time
import webbrowser
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import click

from polar.client import APIError, configured_client
from polar.config import load_config
from polar.contract.states import TERMINAL

# The lifecycle in order (DESIGN.md §2), each state with the stage it belongs to.
STAGES: tuple[tuple[str, str], ...] = (
    ("pending", "queued"),
    ("init", "init"),
    ("ready", "ready"),
    ("running", "run"),
    ("postrun", "postrun"),
    ("completed", "done"),
    ("failed", "done"),
    ("timed_out", "done"),
    ("cancelled", "done"),
)
BAR_WIDTH = 30


def _parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _clock(seconds: float) -> str:
    whole = int(max(seconds, 0))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}s" if value < 60 else _clock(value)


def status_table(status: Mapping[str, Any], now: datetime | None = None) -> str:
    """A batch (``GET /v1/batches/<id>``) as a table of sessions by stage and state, with a progress line."""
    counts: dict[str, int] = dict(status.get("counts") or {})
    total = int(status.get("num_sessions") or sum(counts.values()))
    done = sum(n for state, n in counts.items() if state in TERMINAL)
    created, finished = _parse_time(status.get("created_at")), _parse_time(status.get("finished_at"))
    elapsed = ((finished or now or datetime.now(UTC)) - created).total_seconds() if created else 0.0
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    name = f"  {status['name']}" if status.get("name") else ""
    lines = [
        f"batch {status['batch_id']}{name}: {status['status']}",
        f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} finished"
        f" ({done / total if total else 1:.0%}), elapsed {_clock(elapsed)}",
        "",
        f"{'stage':<9} {'state':<11} {'sessions':>8}",
    ]
    known = [state for state, _ in STAGES]
    rows = [*STAGES, *((state, "?") for state in sorted(counts) if state not in known)]
    previous = None
    for state, stage in rows:
        lines.append(f"{stage if stage != previous else '':<9} {state:<11} {counts.get(state, 0):>8}")
        previous = stage
    attempts = status.get("attempts") or {}
    if attempts.get("retried") or attempts.get("out_of_attempts"):
        lines.append(
            f"attempts lost to the infrastructure: {attempts.get('retried', 0)} retried, "
            f"{attempts.get('out_of_attempts', 0)} samples out of attempts"
        )
    return "\n".join(lines)


def _progress(status: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a watcher on a pipe reprints on: anything but the clock."""
    return (
        status["status"],
        sorted((status.get("counts") or {}).items()),
        sorted((status.get("attempts") or {}).items()),
    )


def watch(
    fetch: Callable[[], Mapping[str, Any]],
    render: Callable[[Mapping[str, Any]], str],
    show: Callable[[str], None],
    interval_s: float,
    every_frame: bool,
    sleep: Callable[[float], None] | None = None,
) -> Mapping[str, Any]:
    """Show ``render(fetch())`` every ``interval_s`` until the batch has finished; returns the last status. With
    ``every_frame`` (a terminal, redrawn in place) every frame is shown; otherwise (a pipe, a log) only frames whose
    counts changed."""
    shown = None
    while True:
        current = fetch()
        if every_frame or _progress(current) != shown:
            show(render(current))
            shown = _progress(current)
        if current["status"] == "finished":
            return current
        (sleep or time.sleep)(interval_s)


def logs_text(session: Mapping[str, Any], events: Mapping[str, Any]) -> str:
    """A session (``GET /v1/sessions/<id>``) and its events (``.../events``): who it is, what happened when and for
    how long, then its evaluation and its error (which holds the harness's output tail when the harness failed)."""
    attempt = f"attempt {session['attempt']}" + (
        f" of {session['max_attempts']}" if session.get("max_attempts") else ""
    )
    reward = "-" if session.get("reward") is None else f"{session['reward']:g}"
    exit_code = "-" if session.get("exit_code") is None else str(session["exit_code"])
    outcome = f" ({session['outcome']})" if session.get("outcome") else ""
    lines = [
        f"session {session['session_id']}",
        f"  batch {session['batch_id']}  task {session['task_id']}  sample {session['sample_index']}  {attempt}",
        f"  {session['state']}{outcome}  reward {reward}  exit code {exit_code}  calls {session.get('num_calls', 0)}"
        f"  node {session.get('node') or '-'}",
    ]
    if session.get("retry_of"):
        lines.append(f"  retry of {session['retry_of']}")
    if session.get("retried_as"):
        lines.append(f"  retried as {session['retried_as']} (this attempt was lost to the infrastructure)")
    lines += ["", f"{'time (UTC)':<23}  {'state':<10} {'for':>9}  {'node':<12} detail"]
    for event in events.get("items", []):
        at = _parse_time(event["at"])
        stamp = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if at else "?"
        took = _seconds(event.get("duration_s")) if event.get("duration_s") is not None else "-"
        lines.append(f"{stamp:<23}  {event['to_state']:<10} {took:>9}  {event.get('node') or '-':<12} "
                     f"{event.get('detail') or ''}".rstrip())  # fmt: skip
    spent = ", ".join(f"{state} {_seconds(s)}" for state, s in (events.get("seconds_in") or {}).items())
    if spent:
        lines.append(f"time in each state: {spent}; total {_seconds(events.get('total_s'))}")
    if session.get("evaluation"):
        lines += ["", "evaluation:", json.dumps(session["evaluation"], indent=2, sort_keys=True)]
    if session.get("error"):
        lines += ["", "error / output tail:", str(session["error"]).rstrip()]
    return "\n".join(lines)


def console_url(api_url: str, batch_id: str) -> str:
    return f"{api_url.rstrip('/')}/ui/batches/{batch_id}"


def _fail(exc: APIError) -> click.ClickException:
    return click.ClickException(str(exc))


_API = click.option("--api", default=None, help="Rollout API URL (default POLAR_API_URL).")
_TOKEN = click.option("--token", default=None, help="API token (default POLAR_API_TOKEN, else POLAR_API_READ_TOKEN).")


@click.command()
@click.argument("batch_id")
@click.option("--watch", "live", is_flag=True, help="Refresh until the batch finishes (Ctrl-C stops watching).")
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(min=0.1), help="Seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead of the table.")
@_API
@_TOKEN
def status(batch_id: str, live: bool, interval: float, as_json: bool, api: str | None, token: str | None) -> None:
    """Show a batch's sessions by stage and state; with --watch, refreshed until the batch finishes."""
    client = configured_client(api, token)
    render: Callable[[Mapping[str, Any]], str] = (lambda s: json.dumps(s)) if as_json else status_table
    try:
        if not live:
            current = client.batch(batch_id)
            click.echo(json.dumps(current, indent=2) if as_json else status_table(current))
            return
        in_place = sys.stdout.isatty() and not as_json
        watch(lambda: client.batch(batch_id), render, _redraw if in_place else click.echo, interval, in_place)
    except APIError as exc:
        raise _fail(exc) from exc
    except KeyboardInterrupt:
        sys.exit(130)  # stopped watching; the batch goes on
    finally:
        client.close()


def _redraw(frame: str) -> None:
    click.clear()
    click.echo(frame)


@click.command()
@click.argument("session_id")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON (session and events) instead.")
@_API
@_TOKEN
def logs(session_id: str, as_json: bool, api: str | None, token: str | None) -> None:
    """Show a session's state changes with times and durations, then its evaluation and error / output tail."""
    client = configured_client(api, token)
    try:
        session, events = client.session(session_id), client.events(session_id)
    except APIError as exc:
        raise _fail(exc) from exc
    finally:
        client.close()
    click.echo(json.dumps({"session": session, "events": events}, indent=2) if as_json else logs_text(session, events))


@click.command("open")
@click.argument("batch_id")
@click.option("--browser", is_flag=True, help="Open it in the default web browser too.")
@_API
def open_console(batch_id: str, browser: bool, api: str | None) -> None:
    """Print the console URL of a batch (<api>/ui/batches/<id>)."""
    url = console_url(api or load_config().api_url, batch_id)
    click.echo(url)
    if browser and not webbrowser.open(url):
        raise click.ClickException("no web browser could be started here; open the URL above yourself")
