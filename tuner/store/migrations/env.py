"""Alembic environment of Kiln's store.

Kiln configures alembic in code (``tuner.store.sql.alembic_config``): no ``alembic.ini``. The store hands
its own connection over in ``config.attributes["connection"]`` so that migrations run with the same
engine settings (SQLite pragmas, PostgreSQL search_path) as the application.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from tuner.store.orm import Base

target_metadata = Base.metadata


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit the SQL of the migrations instead of running it (``alembic upgrade --sql``)."""
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the connection the store passed in, or on a fresh engine for the URL."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = sa.create_engine(context.config.get_main_option("sqlalchemy.url") or "", poolclass=sa.NullPool)
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
