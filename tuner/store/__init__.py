"""Kiln's storage layer: the only package that uses SQLAlchemy.

:class:`Store` (``tuner.store.sql``) owns sessions and returns entities; ``tuner.store.ms_database``
adapts it to MetaSchedule's ``Database`` interface (it imports TVM, so it is not imported here).
"""

from __future__ import annotations

from tuner.store.sql import Store, alembic_config

__all__ = ["Store", "alembic_config"]
