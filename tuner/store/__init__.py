"""Kiln's storage layer: the only package that uses SQLAlchemy.

:class:`Store` (``tuner.store.sql``) owns sessions and returns entities;
``tuner.metaschedule.database`` adapts it to MetaSchedule's ``Database`` interface.
"""

from __future__ import annotations

from tuner.store.sql import Store, alembic_config

__all__ = ["Store", "alembic_config"]
