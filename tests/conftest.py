"""Shared fixtures. Tests run against the machine's real PostgreSQL and Redis (see scripts/ensure-services.sh):
each test that needs a database gets an empty one at the schema of a template migrated once to head (a copy of the
template, or one an earlier test of the process used, emptied: tests/database_pool.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
import redis

from polar.refengine.vllm import vllm_python
from polar.storage.migration import upgrade
from polar.storage.scratch import admin, scratch_database, sqlalchemy_url
from tests.database_pool import DatabasePool
from tests.module_costs import ModuleCosts
from tests.processes import unmount_session_disks
from tests.real_vllm import (
    CONTROLLER_ENV,
    RUN_DIR_ENV,
    SharedVllm,
    shared_vllm,
    shared_vllm_pid,
    start_shared_vllm,
    stop_shared_vllm,
)
from tests.shared_stack import for_one_test, left_as_found, start_shared_stack
from tests.stacks import LIVE_STACKS, RunningStack
from tests.waiting_lane import WaitingLaneScheduling, add_ini

ADMIN_DSN = os.environ.get("POLAR_TEST_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_BASE = os.environ.get("POLAR_TEST_REDIS", "redis://127.0.0.1:6379")
TEMPLATE = f"polar_template_{os.getpid()}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--waiting-lane",
        action="store_true",
        help="with -n N --dist loadfile: keep the last test process for the modules that mostly wait "
        "(tests/waiting_lane.py)",
    )
    add_ini(parser)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> WaitingLaneScheduling | None:
    if config.getoption("waiting_lane") and config.getvalue("dist") == "loadfile":
        return WaitingLaneScheduling(config, log)  # type: ignore[arg-type]
    return None  # xdist's own


def pytest_configure(config: pytest.Config) -> None:
    """The controller (the only process without xdist) makes the run's shared directory, which its test processes
    inherit through the environment: the one real vLLM server of the run is found there (tests/real_vllm.py)."""
    if not hasattr(config, "workerinput") and RUN_DIR_ENV not in os.environ:
        os.environ[RUN_DIR_ENV] = tempfile.mkdtemp(prefix="polar-test-run-")
        os.environ[CONTROLLER_ENV] = str(os.getpid())
        if _whole_suite(config) and vllm_python() is not None:
            start_shared_vllm()  # `make test`: vLLM's start-up overlaps the first modules instead of a test's wait
    if RUN_DIR_ENV in os.environ:
        run_dir, reports = Path(os.environ[RUN_DIR_ENV]), not hasattr(config, "workerinput")
        costs = ModuleCosts(run_dir, reports=reports, shared_server_pid=shared_vllm_pid)
        config.pluginmanager.register(costs, "polar-module-costs")


def _whole_suite(config: pytest.Config) -> bool:
    """A run of the whole suite in test processes (``make test``), not a developer's few files."""
    return bool(getattr(config.option, "numprocesses", None)) and config.args in (
        [],
        ["tests"],
        config.getini("testpaths"),
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and os.environ.get(CONTROLLER_ENV) == str(os.getpid()):
        stop_shared_vllm()
        shutil.rmtree(os.environ.pop(RUN_DIR_ENV), ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _session_disks_unmounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A runtime a test never destroyed leaves its session filesystem mounted; not past this test process."""
    yield
    unmount_session_disks(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def real_vllm() -> SharedVllm:
    """The run's one real vLLM server (started by the first test process that asks; tests/real_vllm.py)."""
    return shared_vllm()


def _expected_seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("long")
    return float(marker.kwargs.get("seconds", 60)) if marker else 0.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked ``long(seconds=N)`` first, the longest first: `make test` deals whole files to two test
    processes in collection order, and a three-minute module dealt last would run alone at the end."""
    items.sort(key=lambda item: -_expected_seconds(item))  # stable: modules stay whole, the rest keep their order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """A failing test's report carries the log tails of every stack up in this process (a timeout included), so
    a failure on a loaded CI machine says what the services were doing."""
    report: pytest.TestReport = yield
    if report.failed and LIVE_STACKS:
        report.sections.append(("stack logs", "\n".join(stack.log_tails() for stack in LIVE_STACKS)))
    return report


def _admin(sql: str) -> None:
    admin(ADMIN_DSN, sql)


@pytest.fixture(scope="session")
def template_database() -> Iterator[str]:
    _admin(f"DROP DATABASE IF EXISTS {TEMPLATE}")
    _admin(f"CREATE DATABASE {TEMPLATE}")
    upgrade(sqlalchemy_url(ADMIN_DSN, TEMPLATE))
    yield TEMPLATE
    _admin(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")


def _fresh_database(prefix: str, template: str | None = None) -> AbstractContextManager[str]:
    return scratch_database(ADMIN_DSN, prefix, template)


@pytest.fixture(scope="session")
def admin_dsn() -> str:
    """The DSN tests create and drop Postgres databases through (``POLAR_TEST_ADMIN_DSN``)."""
    return ADMIN_DSN


@pytest.fixture(scope="session")
def database_pool(template_database: str) -> Iterator[DatabasePool]:
    pool = DatabasePool(ADMIN_DSN, template_database, "polar_test")
    yield pool
    pool.close()


@pytest.fixture
def database_url(database_pool: DatabasePool) -> Iterator[str]:
    """A migrated Postgres database for this test, empty: fresh from the template, or emptied after an earlier test
    of this process (tests/database_pool.py)."""
    url = database_pool.take()
    try:
        yield url
    finally:
        database_pool.give_back(url)


@pytest.fixture
def empty_database_url() -> Iterator[str]:
    """A fresh database with no schema at all (for migration tests)."""
    with _fresh_database("polar_empty") as url:
        yield url


# Databases 1-15 are handed out to stacks; database 0 holds only the leases on them.
REDIS_DATABASES = range(1, 16)
LEASE_S = 3 * 3600  # a killed test run's leases expire on their own


@contextmanager
def redis_database() -> Iterator[str]:
    """The URL of a Redis database no other stack holds, emptied before and after. Each is leased with an atomic
    ``SET NX`` in database 0, so two test suites on one machine (or two modules' stacks) never share queues."""
    leases = redis.Redis.from_url(f"{REDIS_BASE}/0")
    owner = f"{os.getpid()}:{os.urandom(8).hex()}"
    number = next((n for n in REDIS_DATABASES if leases.set(f"polar-test:db:{n}", owner, nx=True, ex=LEASE_S)), None)
    if number is None:
        leases.close()
        raise RuntimeError("every Redis test database is leased; is another suite running (or stuck)?")
    url = f"{REDIS_BASE}/{number}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()
        if leases.get(f"polar-test:db:{number}") == owner.encode():
            leases.delete(f"polar-test:db:{number}")
        leases.close()


@pytest.fixture
def broker_url() -> Iterator[str]:
    """A Redis database of its own (leased, emptied before and after), as the Celery broker."""
    with redis_database() as url:
        yield url


@pytest.fixture(scope="module")
def module_database_url(template_database: str) -> Iterator[str]:
    """A fresh, migrated database shared by one test module (for expensive module-scoped stacks)."""
    with _fresh_database("polar_module", template_database) as url:
        yield url


@pytest.fixture(scope="module")
def module_broker_url() -> Iterator[str]:
    """A Redis database of its own (:func:`redis_database`) shared by one test module's stack."""
    with redis_database() as url:
        yield url


@pytest.fixture(scope="session")
def _process_stack(template_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """This test process's shared stack (tests/shared_stack.py), started by the first module that asks for it."""
    with _fresh_database("polar_shared", template_database) as url, redis_database() as broker:
        yield from start_shared_stack(url, broker, tmp_path_factory.mktemp("shared-stack"))


@pytest.fixture(scope="module")
def shared_stack(_process_stack: RunningStack) -> Iterator[RunningStack]:
    """The process's shared stack for one module: its engine log read from the module's start. A module that leaves
    sessions going or calls paused fails (they would reach the next module's tests)."""
    yield for_one_test(_process_stack)
    problems = left_as_found(_process_stack)
    if problems:
        pytest.fail(f"the module left the shared stack with {', '.join(problems)}")
