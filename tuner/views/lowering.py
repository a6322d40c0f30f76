"""A job's lowering as it recorded it: the program after each graph pass, read from the store alone (no TVM:
``kiln ir`` answers in the time it takes to read a row)."""

from __future__ import annotations

from tuner.entities import IrLevel, Job
from tuner.errors import NotFound
from tuner.store.sql import Store


def ir_levels(store: Store, job: Job) -> list[IrLevel]:
    """A job's lowering levels without their texts; :class:`NotFound` when it has recorded none."""
    levels = store.list_ir_levels(job.id)
    if not levels:
        raise NotFound(f"job '{job.id}' has recorded no lowering levels yet (a job records them as it plans)")
    return levels


def ir_level(store: Store, job: Job, level: str) -> IrLevel:
    """One level of a job's lowering with its text, by position or pass name (the first of that name)."""
    levels = ir_levels(store, job)
    found = next((lv for lv in levels if str(lv.position) == level or lv.name == level), None)
    if found is None:
        names = ", ".join(f"{lv.position} {lv.name}" for lv in levels)
        raise NotFound(f"job '{job.id}' has no lowering level {level!r}; its levels: {names}")
    return store.get_ir_level(job.id, found.position)
