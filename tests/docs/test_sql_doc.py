"""Every SQL example in docs/sql.md runs against a database holding real pipeline output and returns rows."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.contract.task_request import parse_batch_request
from polar.lifecycle.batches import request_hash, submit_batch
from polar.records.audit import Caller, actor
from polar.services import Services
from polar.storage.media import MediaStore, StoredImage
from polar.storage.models import ModelCall, Trajectory
from tests.polar.training.test_feed import finish, queued_sessions
from tests.stage_calls import command_task, domain_services

DOC = Path(__file__).resolve().parents[2] / "docs" / "sql.md"
EXAMPLES = re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def services(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """One database holding real pipeline output, shared by every example: they only read."""
    tmp = tmp_path_factory.mktemp("sql-doc")
    services = domain_services(module_database_url, tmp, ready_buffer=100, plugin_modules=("tests.e2e",))
    # "c": an attempt the infrastructure lost (its evaluator's runtime broke), out of attempts.
    lost = command_task(
        "c", "true", evaluator={"name": "tests.e2e.evaluator_plugins.broken:RuntimeGone"}, max_attempts=1
    )
    body = {"tasks": [command_task("a", "true", samples=2), command_task("b", "exit 1", samples=1), lost]}
    caller = Caller(actor("admin", "doc-token-" + "0" * 30), "127.0.0.1")  # as the API submits, audited
    submit_batch(services, parse_batch_request(body), request_hash(body), caller=caller)
    finish(services, set(queued_sessions(services)))
    with services.db.unit() as db:  # a trajectory with a recorded merge break, as prefix merging stores them
        trajectory = db.scalars(sa.select(Trajectory)).first()
        assert trajectory is not None
        break_ = {"call_id": trajectory.call_ids[0], "seq": 1, "agent": None, "reason": "diverged", "position": 2,
                  "expected_token": 3, "actual_token": 9, "trajectory_index": 0}  # fmt: skip
        trajectory.stats = {**trajectory.stats, "breaks": [break_], "num_breaks": 1}
    with services.db.engine.begin() as connection:  # a call that sent an image, stored as the proxy stores it
        image = StoredImage("ab" * 32, "image/png", b"\x89PNG\r\n\x1a\n", 28, 28)
        MediaStore().store(connection, [image])
        entry = {"sha256": image.sha256, "media_type": "image/png", "message_index": 0, "source": "user",
                 "offset": 3, "length": 4, "width": 28, "height": 28, "image_token_id": 8192, "model": "m"}  # fmt: skip
        first = connection.execute(sa.select(ModelCall.id).limit(1)).scalar_one()
        connection.execute(sa.update(ModelCall).where(ModelCall.id == first).values(media=[entry]))
    yield services
    services.db.dispose()


def test_the_doc_has_examples() -> None:
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize("query", EXAMPLES, ids=[f"example-{i}" for i in range(len(EXAMPLES))])
def test_example_runs_and_returns_rows(services: Services, query: str) -> None:
    with services.db.engine.connect() as connection:
        rows = connection.execute(sa.text(query)).all()
    assert rows, query
