"""The database engine: URLs, SQLite's connection settings, and alembic's configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: Execution option read by the SQLite "begin" hook: which BEGIN a connection of this engine emits.
SQLITE_BEGIN = "kiln_sqlite_begin"


def alembic_config(connection: sa.Connection | None = None, url: str | None = None) -> Config:
    """Alembic configuration for Kiln's migrations, built in code (no ``alembic.ini``).

    Pass ``connection`` to run migrations on it; ``url`` is used only when no connection is given.
    """
    cfg = Config()
    # ConfigParser interpolates '%', which may appear in paths and URLs.
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    cfg.set_main_option("path_separator", "os")
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Take BEGIN away from the sqlite3 module (it defers it past SELECTs, breaking read-modify-write);
    # _sqlite_on_begin emits it instead.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # WAL lets the web server read while a tuning worker writes.
        cursor.execute("PRAGMA journal_mode=WAL")
    finally:
        cursor.close()


def _sqlite_on_begin(conn: sa.Connection) -> None:
    # Writers take the write lock up front (BEGIN IMMEDIATE): a deferred transaction that reads first
    # cannot wait for the lock later in WAL mode and fails with "database is locked" at once.
    conn.exec_driver_sql(conn.get_execution_options().get(SQLITE_BEGIN, "BEGIN"))


def normalize_url(url: str) -> sa.URL:
    """Parse a database URL; a bare ``postgresql://`` gets the psycopg (3) driver Kiln installs."""
    parsed = sa.make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def create_engine(url: str) -> sa.Engine:
    """An engine for ``url``; SQLite connections get WAL, foreign keys, a busy timeout and BEGIN IMMEDIATE
    for writers."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = sa.create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        sa.event.listen(engine, "connect", _sqlite_on_connect)
        sa.event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    return sa.create_engine(parsed, pool_pre_ping=True)
