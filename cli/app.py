"""The ``kiln`` Typer application: its command groups, the global options, and the settings and store
every command works with."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tuner.settings import Settings

if TYPE_CHECKING:
    from tuner.store.sql import Store

app = typer.Typer(
    name="kiln",
    help="Kiln: auto-tune deep-learning models with Apache TVM MetaSchedule.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="Database schema management.", no_args_is_help=True)
app.add_typer(db_app, name="db")
rpc_app = typer.Typer(
    help="Remote measurement through TVM's RPC tracker: run a tracker or a device server, list devices.",
    no_args_is_help=True,
)
app.add_typer(rpc_app, name="rpc")
token_app = typer.Typer(help="API tokens for the REST API (multi-user).", no_args_is_help=True)
app.add_typer(token_app, name="token")


class _State:
    settings: Settings = Settings()


def current_settings() -> Settings:
    """The settings of this invocation: KILN_* variables, overridden by the global options."""
    return _State.settings


def open_store() -> Store:
    """The store of :func:`current_settings`, its schema created or checked."""
    return open_store_for(current_settings())


def open_store_for(settings: Settings) -> Store:
    """The store ``settings`` name, its schema created or checked, this host's jobs left "running" by a
    killed ``kiln tune`` ended."""
    from cli.render import err_console
    from tuner.jobs.in_process import sweep_dead_local_jobs
    from tuner.store.sql import Store

    store = Store.from_settings(settings)
    store.ensure_schema(auto_create=True)
    for job in sweep_dead_local_jobs(store):
        err_console.print(f"job {job.id} cancelled: {job.error}")
    return store


@app.callback()
def _global(
    data_dir: Annotated[Path | None, typer.Option(help="Data directory (env KILN_DATA_DIR)")] = None,
    database_url: Annotated[str | None, typer.Option(help="SQLAlchemy URL (env KILN_DATABASE_URL)")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what Kiln does")] = False,
) -> None:
    """Global options; every one also reads its KILN_* environment variable."""
    overrides: dict[str, Any] = {}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if database_url is not None:
        overrides["database_url"] = database_url
    _State.settings = Settings(**overrides)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
