"""Fixtures shared by every test suite: a database on each backend, a migrated store, settings.

PostgreSQL runs only when ``KILN_TEST_DATABASE_URL`` points at a server (``.ci/run`` starts one; locally:
``line=$(bash .ci/postgres.sh start /tmp/kiln-pg) && eval "$line"``). Each test gets its own schema on
that server, reached through the connection's ``search_path``, and dropped afterwards: tests never see
each other's rows, and the schema name is random so parallel runs cannot collide either.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.ci_guard import REQUIRE_ENV, missing_requirements, required_by_environment
from tuner.settings import Settings
from tuner.store import Store

POSTGRES_URL_ENV = "KILN_TEST_DATABASE_URL"

# One round of a job's side-by-side timing (three fresh processes) instead of three: the figures are not
# what the tests check. tests/integration/test_latency_report.py asks for several rounds, and the CLI's
# subprocesses inherit this.
os.environ.setdefault("KILN_LATENCY_ROUNDS", "1")
# No kernel-by-kernel profile of a finished job (two profiled processes, ~3 s a job) unless a test asks for
# one: the tests that check profiles (test_profile.py, the jobs API's, the CLI's `kiln profile`, the
# dashboard's, whose `kiln serve` keeps every default) set a budget of their own.
os.environ.setdefault("KILN_PROFILE_BUDGET_S", "0")


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to run without what ``KILN_TEST_REQUIRE`` lists: in CI a missing extra or CPU feature would
    otherwise only turn tests into skips."""
    missing = missing_requirements(required_by_environment())
    if missing:
        raise pytest.UsageError(f"{REQUIRE_ENV} asks for what this run lacks: {'; '.join(missing)}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first (in their order), then the rest: run in several processes (``make test``), the long
    ones start at once and the short ones fill the gaps, instead of a few long ones ending the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


#: What the ``slow`` marker means (pyproject.toml): a test that takes longer than this, on 2 cores.
SLOW_S = 5.0
_unmarked_slow: list[tuple[str, float]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Note a test that took longer than SLOW_S without the ``slow`` marker (listed, not failed: a loaded
    machine makes any test slow once)."""
    if report.when == "call" and report.duration > SLOW_S and "slow" not in report.keywords:
        _unmarked_slow.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _unmarked_slow:
        terminalreporter.write_sep("-", f"over {SLOW_S:g} s without the slow marker")
        for nodeid, seconds in sorted(_unmarked_slow, key=lambda item: -item[1]):
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")


BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


def _postgres_schema_url(base_url: str, schema: str) -> str:
    url = sa.make_url(base_url)
    # libpq's "options" sets search_path for every connection of the engine, alembic's included.
    url = url.update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False)


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of an empty database, on SQLite (always) and on PostgreSQL (when configured)."""
    if request.param == "sqlite":
        # Not kiln.db: that name belongs to the `settings` fixture's database in the same tmp_path.
        yield f"sqlite:///{tmp_path / 'kiln-test.db'}"
        return
    base_url = os.environ.get(POSTGRES_URL_ENV)
    if not base_url:
        pytest.skip(f"PostgreSQL backend not tested: set {POSTGRES_URL_ENV} (bash .ci/postgres.sh start DIR)")
    schema = f"kiln_test_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(base_url, poolclass=sa.NullPool)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        yield _postgres_schema_url(base_url, schema)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    """A store with the current schema, on each backend."""
    s = Store(database_url)
    s.upgrade()
    try:
        yield s
    finally:
        s.dispose()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings with every file (SQLite database, models, jobs) under the test's tmp_path."""
    # Explicit database_url=None: a KILN_DATABASE_URL in the environment must not leak into tests.
    return Settings(data_dir=tmp_path, database_url=None)
