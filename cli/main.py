"""The ``kiln`` command line: tune a model, inspect its tasks, list jobs, export results, operate the
service. The commands live in :mod:`cli.tuning`, :mod:`cli.browse` and :mod:`cli.ops`; importing
them registers them on :data:`cli.app.app`."""

from __future__ import annotations

import sys

# isort: off
# Importing the command modules registers their commands, in the order `kiln --help` lists them.
from cli import tuning, browse, ops  # noqa: F401

# isort: on
from cli.app import app
from cli.render import err_console
from tuner.errors import KilnError, TuningFailed


def main() -> None:
    """Entry point of the ``kiln`` console script: typed errors become one readable line."""
    try:
        app()
    except TuningFailed as exc:
        err_console.print(f"[bold red]job failed:[/] {exc.message}")
        sys.exit(1)
    except KilnError as exc:
        err_console.print(f"[bold red]error ({exc.kind}):[/] {exc.message}")
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted; records measured so far are kept")
        sys.exit(130)


__all__ = ["app", "main"]

if __name__ == "__main__":
    main()
