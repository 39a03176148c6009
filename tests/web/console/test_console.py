"""The console through Flask's test client, on rows written straight to Postgres and a real reference engine:
who may see it (tokens, the login cookie, CSRF, redirects), that model output is text and never markup, paging,
and what it shows when the engine cannot decode tokens."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from flask import Flask
from flask.testing import FlaskClient

from polar.config import load_config
from polar.local.launcher import Stack, engine_spec, free_port
from polar.storage.models import Batch, ModelCall, Session, SessionEvent, Task, Trajectory
from web.api import create_app

ADMIN = "console-admin-" + "a" * 30
READ = "console-reader-" + "b" * 30
XSS = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
BIG = 4500  # tokens of the trajectory that needs three pages


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    with Stack([engine_spec(port, "scripted")], {}, tmp_path_factory.mktemp("engine") / "logs"):
        yield f"http://127.0.0.1:{port}"


def make_app(database_url: str, engine_url: str, tmp: Path, admin: str = ADMIN, read: str = READ) -> Flask:
    env = {
        "POLAR_DATABASE_URL": database_url,
        "POLAR_BROKER_URL": "memory://",
        "POLAR_ENGINE_URLS": engine_url,
        "POLAR_API_TOKEN": admin,
        "POLAR_API_READ_TOKEN": read,
    }
    return create_app(load_config(env, cwd=tmp))


@pytest.fixture(scope="module")
def apps(module_database_url: str, engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    made: list[Flask] = []
    tmp = tmp_path_factory.mktemp("console-apps")

    def make(engine: str = engine_url, **tokens: str) -> Flask:
        made.append(make_app(module_database_url, engine, tmp, **tokens))
        return made[-1]

    yield make
    for app in made:
        app.extensions["polar"].db.dispose()


@pytest.fixture(scope="module")
def app(apps: Any) -> Flask:
    return apps()  # type: ignore[no-any-return]


def tokenize(engine_url: str, text: str) -> list[int]:
    # A hang guard (httpx's default of 5 s is sized for a quiet machine), not a speed claim.
    return list(httpx.post(f"{engine_url}/tokenize", json={"prompt": text}, timeout=120).json()["tokens"])


@pytest.fixture(scope="module")
def rows(app: Flask, engine_url: str) -> dict[str, str]:
    """A batch named like an attack, whose session failed printing one, after two calls whose model output is one:
    trajectory 0 holds both calls; trajectory 1 is long enough for three pages."""
    prompt, answer, tail, closing = (tokenize(engine_url, t) for t in ("Say hello.", XSS, " Again?", "ok"))
    batch_id, task_pk, session_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    first, second = uuid.uuid4(), uuid.uuid4()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    states = ["pending", "init", "ready", "running", "postrun", "failed"]
    with app.extensions["polar"].db.unit() as db:
        db.add(Batch(id=batch_id, name=XSS, request_hash="h", num_sessions=1, defaults={}))
        db.flush()
        db.add(Task(id=task_pk, batch_id=batch_id, position=0, task_id="t-xss", num_samples=1, spec={}))
        db.flush()
        db.add(Session(id=session_id, batch_id=batch_id, task_pk=task_pk, task_id="t-xss", sample_index=0,
                       state="failed", outcome="exited", outcome_class="task", reward=0.0, exit_code=1,
                       error=f"harness exited with code 1: {XSS}", evaluation={"note": XSS}, num_calls=2, node="n1",
                       created_at=start, finished_at=start + timedelta(seconds=5)))  # fmt: skip
        db.flush()
        for index, state in enumerate(states):
            at = start + timedelta(seconds=index)
            before = states[index - 1] if index else None
            db.add(SessionEvent(session_id=session_id, from_state=before, to_state=state, at=at, node="n1", worker="w"))
        chain = prompt + answer + tail
        for call_id, seq, prompt_ids, completion in ((first, 1, prompt, answer), (second, 2, chain, closing)):
            db.add(ModelCall(id=call_id, session_id=session_id, seq=seq, provider="openai_chat",
                             prompt_token_ids=prompt_ids, completion_token_ids=completion,
                             logprobs=[-0.5] * len(completion), finish_reason="stop", status_code=200, latency_ms=12.5,
                             request={"messages": [{"role": "user", "content": XSS}]},
                             normalized_request={"messages": [{"role": "user", "content": XSS}]},
                             response={"choices": [{"message": {"content": XSS}}]}))  # fmt: skip
        tokens = chain + closing
        mask = [0] * len(prompt) + [1] * len(answer) + [0] * len(tail) + [1] * len(closing)
        db.add(Trajectory(session_id=session_id, position=0, reconstruction="prefix_merging", token_ids=tokens,
                          loss_mask=mask, logprobs=[-0.5 * m for m in mask], call_ids=[str(first), str(second)],
                          stats={"num_calls": 2, "breaks": []}))  # fmt: skip
        big = [100 + i % 50 for i in range(BIG)]
        alternating = [i % 2 for i in range(BIG)]
        db.add(Trajectory(session_id=session_id, position=1, reconstruction="per_request", token_ids=big,
                          loss_mask=alternating, logprobs=[0.0] * BIG, call_ids=[], stats={}))  # fmt: skip
    with app.extensions["polar"].db.unit() as db:
        trajectories = db.query(Trajectory.id).filter(Trajectory.session_id == session_id).order_by(Trajectory.position)
        small, large = (str(t.id) for t in trajectories)
    return {"batch": str(batch_id), "session": str(session_id), "call": str(first), "trajectory": small,
            "big": large}  # fmt: skip


def pages(rows: dict[str, str]) -> list[str]:
    return [
        "/ui/",
        f"/ui/batches/{rows['batch']}",
        f"/ui/sessions/{rows['session']}",
        f"/ui/calls/{rows['call']}",
        f"/ui/trajectories/{rows['trajectory']}",
    ]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def csrf_of(client: FlaskClient) -> str:
    form = client.get("/ui/login").get_data(as_text=True)
    match = re.search(r'name="csrf" value="([^"]+)"', form)
    assert match, form
    return match.group(1)


def test_pages_need_a_token_or_a_login(app: Flask, rows: dict[str, str]) -> None:
    client = app.test_client()
    for path in pages(rows):
        away = client.get(path)
        assert away.status_code == 302 and away.location.startswith("/ui/login?next="), path
        wrong = client.get(path, headers=bearer("x" * 40))
        assert wrong.status_code == 401 and "wrong bearer token" in wrong.get_data(as_text=True)
        assert wrong.mimetype == "text/html"
        for token in (READ, ADMIN):
            assert client.get(path, headers=bearer(token)).status_code == 200, (path, token)
    assert client.get("/ui", headers=bearer(READ)).status_code == 200
    assert client.get("/ui/static/console.css").status_code == 200  # the login form needs its style
    assert client.get("/v1/batches/" + rows["batch"]).status_code == 401  # the API's own check is untouched


def test_login_sets_a_signed_cookie_and_logout_clears_it(app: Flask, rows: dict[str, str]) -> None:
    client = app.test_client()
    target = f"/ui/sessions/{rows['session']}"
    assert client.post("/ui/login", data={"token": READ, "next": target}).status_code == 400  # no CSRF token
    csrf = csrf_of(client)
    refused = client.post("/ui/login", data={"token": ADMIN[:-1], "csrf": csrf, "next": target})
    assert refused.status_code == 401 and "not one of this API" in refused.get_data(as_text=True)
    signed_in = client.post("/ui/login", data={"token": READ, "csrf": csrf, "next": target})
    assert signed_in.status_code == 302 and signed_in.location == target
    cookie = signed_in.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/ui" in cookie and READ not in cookie
    page = client.get("/ui/")
    assert page.status_code == 200 and "read:" in page.get_data(as_text=True)
    session_cookie = client.get_cookie("polar_console", path="/ui")
    assert session_cookie is not None
    # The cookie opens the console only, never the API.
    client.set_cookie("polar_console", session_cookie.value, path="/")
    assert client.get(f"/v1/batches/{rows['batch']}").status_code == 401
    client.delete_cookie("polar_console", path="/")
    assert client.get("/ui/logout").status_code == 302
    assert client.get("/ui/").status_code == 302


@pytest.mark.parametrize("target", ["https://evil.example/ui/", "//evil.example/ui/", "/v1/batches", "/ui\\..\\x"])
def test_login_only_returns_into_the_console(app: Flask, target: str) -> None:
    client = app.test_client()
    answer = client.post("/ui/login", data={"token": READ, "csrf": csrf_of(client), "next": target})
    assert answer.status_code == 302 and answer.location == "/ui/"


def test_a_cookie_holds_across_workers_until_a_token_changes(apps: Any, app: Flask, rows: dict[str, str]) -> None:
    client = app.test_client()
    client.post("/ui/login", data={"token": READ, "csrf": csrf_of(client)})
    cookie = client.get_cookie("polar_console", path="/ui")
    assert cookie is not None
    for other, status in ((apps(), 200), (apps(admin="rotated-admin-" + "c" * 30), 302)):
        other_client = other.test_client()
        other_client.set_cookie("polar_console", cookie.value, path="/ui")
        assert other_client.get("/ui/").status_code == status


def test_model_output_is_text_never_markup(app: Flask, rows: dict[str, str]) -> None:
    client = app.test_client()
    for path in pages(rows):
        html = client.get(path, headers=bearer(READ)).get_data(as_text=True)
        assert html.count("<script") == 1, path  # console.js, nothing else
        assert "<script>alert" not in html
        if "trajectories" not in path:
            assert ESCAPED in html, path
    viewer = client.get(f"/ui/trajectories/{rows['trajectory']}", headers=bearer(READ)).get_data(as_text=True)
    sampled = re.findall(r'<span class="run sampled">(.*?)</span></span>', viewer)
    shown = "".join(re.sub(r"<[^>]+>", "", run) for run in sampled)
    assert ESCAPED in shown  # the model's script, decoded token by token, as text
    assert 'title="#' in viewer and "logprob -0.5000" in viewer


def test_pages_carry_a_strict_content_security_policy(app: Flask) -> None:
    answer = app.test_client().get("/ui/", headers=bearer(READ))
    assert "script-src 'self'" in answer.headers["Content-Security-Policy"]
    assert answer.headers["Cache-Control"] == "no-store"


def test_a_long_trajectory_comes_a_page_at_a_time(app: Flask, rows: dict[str, str]) -> None:
    client = app.test_client()
    path = f"/ui/trajectories/{rows['big']}"

    def page(number: int | str) -> str:
        answer = client.get(f"{path}?page={number}", headers=bearer(READ))
        assert answer.status_code == 200
        return answer.get_data(as_text=True)

    first, last = page(1), page(3)
    assert first.count('<span class="t') == 2000 and 'rel="next" href="' + path + '?page=2"' in first
    assert last.count('<span class="t') == BIG - 4000 and 'rel="next"' not in last
    assert page(99).count('<span class="t') == BIG - 4000  # past the end: the last page
    assert "page 3 of 3" in last
    assert client.get(f"{path}?page=0", headers=bearer(READ)).status_code == 400


def test_without_an_engine_tokens_show_as_ids(apps: Any, rows: dict[str, str]) -> None:
    app = apps(engine=f"http://127.0.0.1:{free_port()}")
    html = app.test_client().get(f"/ui/trajectories/{rows['trajectory']}", headers=bearer(READ))
    assert html.status_code == 200
    text = html.get_data(as_text=True)
    assert "Token text unavailable" in text and "no engine reachable" in text and "⟨" in text


def test_unknown_ids_and_bad_arguments_are_error_pages(app: Flask, rows: dict[str, str]) -> None:
    client = app.test_client()
    for path in (f"/ui/batches/{uuid.uuid4()}", "/ui/sessions/not-a-uuid", f"/ui/trajectories/{uuid.uuid4()}"):
        answer = client.get(path, headers=bearer(READ))
        assert (
            answer.status_code == 404
            and answer.mimetype == "text/html"
            and "not found" in answer.get_data(as_text=True)
        )
    bad = client.get(f"/ui/batches/{rows['batch']}?min_reward=lots", headers=bearer(READ))
    assert bad.status_code == 400 and "min_reward" in bad.get_data(as_text=True)


def test_the_batch_page_counts_and_accepts(app: Flask, rows: dict[str, str]) -> None:
    client = app.test_client()
    html = client.get(f"/ui/batches/{rows['batch']}", headers=bearer(READ)).get_data(as_text=True)
    assert re.search(r'data-state="failed">1<', html)
    assert '<dd id="acceptance">0%' in html  # one finished sample, reward 0.0
    accepting = client.get(f"/ui/batches/{rows['batch']}?min_reward=0", headers=bearer(READ)).get_data(as_text=True)
    assert '<dd id="acceptance">100%' in accepting


def test_pages_of_work_still_moving_reload_themselves(app: Flask, rows: dict[str, str]) -> None:
    batch_id, task_pk, session_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    with app.extensions["polar"].db.unit() as db:
        db.add(Batch(id=batch_id, name="moving", request_hash="h", num_sessions=1, defaults={}))
        db.flush()
        db.add(Task(id=task_pk, batch_id=batch_id, position=0, task_id="t", num_samples=1, spec={}))
        db.flush()
        db.add(Session(id=session_id, batch_id=batch_id, task_pk=task_pk, task_id="t", sample_index=0, state="running"))
    client = app.test_client()
    refresh = '<meta http-equiv="refresh" content="5">'
    for path in (f"/ui/batches/{batch_id}", f"/ui/sessions/{session_id}"):
        assert refresh in client.get(path, headers=bearer(READ)).get_data(as_text=True), path
    for path in (f"/ui/batches/{rows['batch']}", f"/ui/sessions/{rows['session']}", f"/ui/calls/{rows['call']}"):
        assert refresh not in client.get(path, headers=bearer(READ)).get_data(as_text=True), path  # finished: still
