"""Kiln's SQL store: the one place that opens sessions. It speaks entities, never ORM rows.

Works on SQLite (the embedded default, one file in the data directory) and on PostgreSQL (shared by a
pool of workers). The schema is owned by alembic; :meth:`Store.ensure_schema` refuses an old one.

:class:`Store` is one object over one database; its queries are grouped by what they store:
:mod:`~tuner.store.model_queries`, :mod:`~tuner.store.job_queries`, :mod:`~tuner.store.queue`, :mod:`~tuner.store.group_queries`,
:mod:`~tuner.store.record_queries`, :mod:`~tuner.store.cost_model_queries`,
:mod:`~tuner.store.profile_queries`, :mod:`~tuner.store.device_queries` and
:mod:`~tuner.store.token_queries`, all on
:class:`~tuner.store.base.StoreBase` (engine, sessions, schema).
"""

from __future__ import annotations

from tuner.store.cost_model_queries import CostModelQueries
from tuner.store.device_queries import DeviceQueries
from tuner.store.engine import MIGRATIONS_DIR, alembic_config, normalize_url
from tuner.store.group_queries import GroupQueries
from tuner.store.job_queries import JobQueries
from tuner.store.model_queries import ModelQueries
from tuner.store.profile_queries import ProfileQueries
from tuner.store.queue import QueueQueries
from tuner.store.record_queries import RecordQueries
from tuner.store.token_queries import TokenQueries


class Store(
    ModelQueries,
    JobQueries,
    QueueQueries,
    GroupQueries,
    RecordQueries,
    CostModelQueries,
    ProfileQueries,
    DeviceQueries,
    TokenQueries,
):
    """Models, jobs, tasks, workloads, tuning records, cost models, artifacts, profiles, machine limits,
    the RPC servers jobs measured on, split jobs' task groups, and tokens in one SQL database."""


__all__ = ["MIGRATIONS_DIR", "Store", "alembic_config", "normalize_url"]
