"""What every part of the store shares: the engine, sessions that commit or roll back, the schema
check, and the row lookups that raise :class:`NotFound`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from alembic import command
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from tuner.errors import Conflict, NotFound, SchemaOutdated
from tuner.store.engine import SQLITE_BEGIN, alembic_config, create_engine
from tuner.store.orm import Base, JobRow, ModelRow, TuningRecordRow

if TYPE_CHECKING:
    from tuner.settings import Settings

log = logging.getLogger(__name__)


def _describe(exc: IntegrityError) -> str:
    detail = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
    return f"the change conflicts with data already stored ({detail})"


_S = TypeVar("_S", bound="StoreBase")


class StoreBase:
    """A SQL database with Kiln's schema; the query mixins of :class:`tuner.store.sql.Store` build on it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine = create_engine(url)
        self._read_sessions = sessionmaker(self._engine, expire_on_commit=False)
        writer = self._engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"})
        self._write_sessions = sessionmaker(writer, expire_on_commit=False)

    @classmethod
    def from_settings(cls: type[_S], settings: Settings) -> _S:
        """The store the settings point at; creates the data directory for SQLite."""
        url = settings.resolved_database_url
        parsed = sa.make_url(url)
        if parsed.get_backend_name() == "sqlite":
            settings.data_dir.mkdir(parents=True, exist_ok=True)
            if parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        return cls(url)

    def __repr__(self) -> str:
        return f"Store({self._engine.url.render_as_string(hide_password=True)!r})"

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine (for migrations tooling and tests; application code uses methods)."""
        return self._engine

    @property
    def backend(self) -> str:
        """The database backend: ``"sqlite"`` or ``"postgresql"``."""
        return self._engine.dialect.name

    def dispose(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()

    @contextmanager
    def session_scope(self, *, write: bool = True, conflict: str | None = None) -> Iterator[Session]:
        """A session that commits on success and rolls back on error (for the store's methods and tests).

        An integrity violation becomes :class:`Conflict` (with ``conflict`` as its message when given);
        other database errors pass through. ``write=False`` lets SQLite readers run beside a writer.
        """
        session = (self._write_sessions if write else self._read_sessions)()
        try:
            yield session
            session.commit()
        except IntegrityError as exc:
            session.rollback()
            raise Conflict(conflict or _describe(exc)) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    # ---- schema ------------------------------------------------------------------------------------

    @cached_property
    def _scripts(self) -> ScriptDirectory:
        return ScriptDirectory.from_config(alembic_config())

    def upgrade(self, revision: str = "head") -> None:
        """Migrate the database to ``revision`` (the latest by default)."""
        with self._engine.begin() as conn:
            command.upgrade(alembic_config(conn), revision)

    def current_revision(self) -> str | None:
        """The alembic revision the database is at (None for a database Kiln never migrated)."""
        with self._engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def head_revision(self) -> str:
        """The revision this version of Kiln needs."""
        head = self._scripts.get_current_head()
        assert head is not None, "Kiln ships at least one migration"
        return head

    def ensure_schema(self, auto_create: bool = True) -> None:
        """Check that the schema is current; create it in an empty database when ``auto_create``.

        Raises :class:`SchemaOutdated` (saying which command fixes it) for any other revision.
        """
        head = self.head_revision()
        with self._engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
            tables = set(sa.inspect(conn).get_table_names())
        if current == head:
            return
        if current is None and not tables & set(Base.metadata.tables):
            if auto_create:
                log.info("creating Kiln's schema (revision %s) in an empty database", head)
                self.upgrade()
                return
            raise SchemaOutdated(f"the database has no Kiln schema, Kiln needs {head}: run `kiln db upgrade`")
        if current is not None and not self._known_revision(current):
            raise SchemaOutdated(
                f"database schema is at revision {current}, which this version of Kiln does not know "
                f"(it needs {head}): upgrade Kiln or point it at another database"
            )
        raise SchemaOutdated(
            f"database schema is at revision {current or 'none'}, Kiln needs {head}: run `kiln db upgrade`"
        )

    def _known_revision(self, revision: str) -> bool:
        try:
            return self._scripts.get_revision(revision) is not None
        except CommandError:
            return False

    # ---- row lookups ------------------------------------------------------------------------------

    @staticmethod
    def _model_row(s: Session, model_id: str, owner: str | None = None) -> ModelRow:
        row = s.get(ModelRow, model_id)
        # Another owner's model is reported exactly like a missing one.
        if row is None or (owner is not None and row.owner != owner):
            raise NotFound(f"model '{model_id}' not found")
        return row

    @staticmethod
    def _job_row(s: Session, job_id: str, *, fresh: bool = False, owner: str | None = None) -> JobRow:
        row = s.get(JobRow, job_id, populate_existing=fresh)
        if row is None or (owner is not None and row.owner != owner):
            raise NotFound(f"job '{job_id}' not found")
        return row


def of_owner(query: Any, owner: str | None) -> Any:
    """Records of ``owner``'s jobs only (None: every record, the shared pool)."""
    if owner is None:
        return query
    return query.where(TuningRecordRow.job_id.in_(sa.select(JobRow.id).where(JobRow.owner == owner)))


def rowcount(result: sa.Result[Any]) -> int:
    """Rows an UPDATE or DELETE changed."""
    return int(getattr(result, "rowcount", 0))
