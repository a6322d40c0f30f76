"""Workloads (a task's TIR by structural hash), a job's tasks, and the tuning records measured for them."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from tuner.entities import (
    BestRecord,
    Job,
    KernelAssembly,
    NewRecord,
    Record,
    StoredRecord,
    StoredWorkload,
    Task,
    TimelineEntry,
)
from tuner.errors import NotFound
from tuner.store.base import StoreBase, of_owner
from tuner.store.convert import is_valid, mean_run_sec, record_entity, task_entity
from tuner.store.orm import VALID_RUN_SEC_LIMIT, TaskRow, TuningRecordRow, WorkloadRow


class RecordQueries(StoreBase):
    """Workloads, tasks and tuning records."""

    # ---- workloads --------------------------------------------------------------------------------------

    def find_workloads(self, shash: str) -> list[StoredWorkload]:
        """Every workload with this structural hash, oldest first."""
        with self.session_scope(write=False) as s:
            rows = s.execute(
                sa.select(WorkloadRow.id, WorkloadRow.workload_json)
                .where(WorkloadRow.shash == shash)
                .order_by(WorkloadRow.id)
            )
            return [StoredWorkload(wid, wjson) for wid, wjson in rows]

    def add_workload(
        self,
        shash: str,
        workload_json: str,
        tir_script: str,
        family: str | None = None,
        anchor: str | None = None,
    ) -> int:
        """Store a workload and return its id; an identical one (same hash and JSON) is reused.

        Structurally equal workloads with different JSON are told apart by the caller, which has TVM.
        ``family``: what it shares with the same operator at other shapes (see :meth:`family_workloads`);
        ``anchor``: with the same operator under other fused epilogues (see :meth:`anchor_workloads`).
        """
        with self.session_scope() as s:
            if self.backend == "postgresql":
                # Serialize writers of one hash so that two workers tuning the same task share one row.
                s.execute(sa.select(sa.func.pg_advisory_xact_lock(zlib.crc32(shash.encode()))))
            existing = s.scalars(
                sa.select(WorkloadRow.id)
                .where(WorkloadRow.shash == shash, WorkloadRow.workload_json == workload_json)
                .order_by(WorkloadRow.id)
            ).first()
            if existing is not None:
                return existing
            row = WorkloadRow(
                shash=shash, workload_json=workload_json, tir_script=tir_script, family=family, anchor=anchor
            )
            s.add(row)
            s.flush()
            return row.id

    def family_workloads(
        self,
        family: str,
        target_key: str,
        owner: str | None = None,
        limit: int = 64,
        max_record_id: int | None = None,
    ) -> list[StoredWorkload]:
        """The workloads of ``family`` with a valid record on ``target_key`` (of ``owner``'s jobs when
        given; up to record ``max_record_id`` when given), the most recently measured first, at most
        ``limit``."""
        return self._measured_workloads(WorkloadRow.family == family, target_key, owner, limit, max_record_id)

    def anchor_workloads(
        self,
        anchor: str,
        target_key: str,
        owner: str | None = None,
        limit: int = 64,
        max_record_id: int | None = None,
    ) -> list[StoredWorkload]:
        """As :meth:`family_workloads`, for the workloads sharing the anchor ``anchor``."""
        return self._measured_workloads(WorkloadRow.anchor == anchor, target_key, owner, limit, max_record_id)

    def _measured_workloads(
        self, which: Any, target_key: str, owner: str | None, limit: int, max_record_id: int | None
    ) -> list[StoredWorkload]:
        valid = [
            TuningRecordRow.target_key == target_key,
            TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT,
        ]
        if max_record_id is not None:
            valid.append(TuningRecordRow.id <= max_record_id)
        measured = of_owner(
            sa.select(TuningRecordRow.workload_id, sa.func.max(TuningRecordRow.id).label("last"))
            .where(*valid)
            .group_by(TuningRecordRow.workload_id),
            owner,
        ).subquery()
        query = (
            sa.select(WorkloadRow.id, WorkloadRow.workload_json)
            .join(measured, measured.c.workload_id == WorkloadRow.id)
            .where(which)
            .order_by(measured.c.last.desc())
            .limit(limit)
        )
        with self.session_scope(write=False) as s:
            return [StoredWorkload(wid, wjson) for wid, wjson in s.execute(query)]

    def workloads_without_family(self, target_key: str, limit: int = 256) -> list[StoredWorkload]:
        """Workloads measured on ``target_key`` whose family or anchor was never computed (stored before
        they were kept), for the caller, which has TVM, to compute them."""
        measured = sa.select(TuningRecordRow.workload_id).where(TuningRecordRow.target_key == target_key)
        query = (
            sa.select(WorkloadRow.id, WorkloadRow.workload_json)
            .where(
                sa.or_(WorkloadRow.family.is_(None), WorkloadRow.anchor.is_(None)),
                WorkloadRow.id.in_(measured),
            )
            .order_by(WorkloadRow.id)
            .limit(limit)
        )
        with self.session_scope(write=False) as s:
            return [StoredWorkload(wid, wjson) for wid, wjson in s.execute(query)]

    def set_workload_families(self, families: dict[int, str], anchors: dict[int, str] | None = None) -> None:
        """Keep the families and anchors computed for stored workloads (workload id -> family or anchor;
        "" for a workload that has none, so that it is not computed again)."""
        anchors = anchors or {}
        with self.session_scope() as s:
            for workload_id in families.keys() | anchors.keys():
                values = {"family": families.get(workload_id), "anchor": anchors.get(workload_id)}
                s.execute(
                    sa.update(WorkloadRow)
                    .where(WorkloadRow.id == workload_id)
                    .values({k: v for k, v in values.items() if v is not None})
                )

    def get_workload_script(self, workload_id: int) -> str:
        """The TVMScript of a workload."""
        with self.session_scope(write=False) as s:
            script = s.scalar(sa.select(WorkloadRow.tir_script).where(WorkloadRow.id == workload_id))
            if script is None:
                raise NotFound(f"workload {workload_id} not found")
            return script

    def get_workload_json(self, workload_id: int) -> str:
        """MetaSchedule's JSON of a workload (``Workload.from_json`` reads it back)."""
        with self.session_scope(write=False) as s:
            found = s.scalar(sa.select(WorkloadRow.workload_json).where(WorkloadRow.id == workload_id))
            if found is None:
                raise NotFound(f"workload {workload_id} not found")
            return found

    # ---- tasks ------------------------------------------------------------------------------------------

    def add_tasks(self, job_id: str, tasks: list[dict[str, Any]]) -> list[Task]:
        """Append tasks (dicts with name, weight, flops, workload_id) to a job, in order."""
        with self.session_scope() as s:
            self._job_row(s, job_id)
            wanted = {int(t["workload_id"]) for t in tasks}
            hashes = dict(
                s.execute(
                    sa.select(WorkloadRow.id, WorkloadRow.shash).where(WorkloadRow.id.in_(wanted))
                ).all()
            )
            missing = sorted(wanted - hashes.keys())
            if missing:
                raise NotFound(f"workload {missing[0]} not found")
            start = s.scalar(sa.select(sa.func.count(TaskRow.id)).where(TaskRow.job_id == job_id)) or 0
            rows = [
                TaskRow(
                    job_id=job_id,
                    workload_id=int(t["workload_id"]),
                    name=str(t["name"]),
                    weight=int(t["weight"]),
                    flops=float(t["flops"]),
                    trials=0,
                    position=start + i,
                )
                for i, t in enumerate(tasks)
            ]
            s.add_all(rows)
            s.flush()
            return [task_entity(r, hashes[r.workload_id]) for r in rows]

    def list_tasks(self, job_id: str) -> list[Task]:
        """The job's tasks in extraction order."""
        with self.session_scope(write=False) as s:
            rows = s.execute(
                sa.select(TaskRow, WorkloadRow.shash)
                .join(WorkloadRow, WorkloadRow.id == TaskRow.workload_id)
                .where(TaskRow.job_id == job_id)
                .order_by(TaskRow.position, TaskRow.id)
            )
            return [task_entity(task, shash) for task, shash in rows]

    def update_task(self, task_id: int, *, trials: int, best_latency_us: float | None) -> Task:
        """Record a task's tuning progress; returns the updated task."""
        with self.session_scope() as s:
            row = s.get(TaskRow, task_id)
            if row is None:
                raise NotFound(f"task {task_id} not found")
            row.trials = trials
            row.best_latency_us = best_latency_us
            s.flush()
            shash = s.scalar(sa.select(WorkloadRow.shash).where(WorkloadRow.id == row.workload_id))
            return task_entity(row, shash or "")

    def set_schedule_sources(self, sources: dict[int, str]) -> None:
        """Keep where each task's compiled schedule came from (task id -> source)."""
        with self.session_scope() as s:
            for task_id, source in sources.items():
                s.execute(sa.update(TaskRow).where(TaskRow.id == task_id).values(schedule_source=source))

    def set_search_stats(self, task_id: int, stats: dict[str, Any]) -> Task:
        """Keep what the space's hooks did in a task's search (replacing an earlier attempt's figures)."""
        with self.session_scope() as s:
            row = s.get(TaskRow, task_id)
            if row is None:
                raise NotFound(f"task {task_id} not found")
            row.search_stats_json = json.dumps(stats)
            s.flush()
            shash = s.scalar(sa.select(WorkloadRow.shash).where(WorkloadRow.id == row.workload_id))
            return task_entity(row, shash or "")

    def set_task_assembly(self, task_id: int, text: str, mix: dict[str, Any]) -> None:
        """Keep a task's kernel as compiled into its job's model (replacing an earlier attempt's)."""
        with self.session_scope() as s:
            row = s.get(TaskRow, task_id)
            if row is None:
                raise NotFound(f"task {task_id} not found")
            row.asm_zlib = zlib.compress(text.encode(), 6)
            row.asm_mix_json = json.dumps(mix)

    def get_task_assembly(self, task_id: int) -> KernelAssembly:
        """A task's compiled kernel; :class:`NotFound` before its job compiled the model."""
        with self.session_scope(write=False) as s:
            found = s.execute(
                sa.select(TaskRow.name, TaskRow.asm_zlib, TaskRow.asm_mix_json).where(TaskRow.id == task_id)
            ).first()
            if found is None:
                raise NotFound(f"task {task_id} not found")
            name, packed, mix = found
            if packed is None:
                raise NotFound(
                    f"task {task_id} ({name}) has no assembly yet: its job keeps it when it compiles the model"
                )
            return KernelAssembly(task_id, name, zlib.decompress(packed).decode(), json.loads(mix or "{}"))

    # ---- tuning records ---------------------------------------------------------------------------------

    def add_record(
        self,
        *,
        workload_id: int,
        job_id: str | None,
        target_key: str,
        target_json: str,
        trace_json: str,
        run_secs: list[float],
        args_info_json: str,
        record_json: str,
        error: str | None = None,
    ) -> int:
        """Store one measured candidate in its own transaction; returns its id.

        Failed candidates (no or non-finite run times, or MetaSchedule's 1e10) are kept, never applied.
        """
        secs = [float(x) for x in run_secs]
        with self.session_scope() as s:
            row = TuningRecordRow(
                workload_id=workload_id,
                job_id=job_id,
                target_key=target_key,
                target_json=target_json,
                trace_json=trace_json,
                run_secs_json=json.dumps(secs),
                mean_run_sec=mean_run_sec(secs),
                error=error,
                args_info_json=args_info_json,
                record_json=record_json,
            )
            s.add(row)
            s.flush()
            return row.id

    def job_records(self, job: Job, owner: str | None = None) -> list[StoredRecord]:
        """The valid records of a job's tasks' workloads on its target (of ``owner``'s jobs when given):
        what its artifact ships and its record download holds."""
        workload_ids = [t.workload_id for t in self.list_tasks(job.id)]
        return self.all_records(job.target_key, workload_ids=workload_ids, valid_only=True, owner=owner)

    def top_records(
        self,
        workload_id: int,
        target_key: str,
        k: int,
        owner: str | None = None,
        max_record_id: int | None = None,
    ) -> list[str]:
        """``record_json`` of the ``k`` fastest valid records of a workload on a target, fastest first.

        ``owner`` (here and in the other record queries): only records of that owner's jobs; None: all.
        ``max_record_id``: only the records stored up to that one (what the store held at that moment).
        """
        if k <= 0:
            return []
        query = (
            sa.select(TuningRecordRow.record_json)
            .where(
                TuningRecordRow.workload_id == workload_id,
                TuningRecordRow.target_key == target_key,
                TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT,
            )
            .order_by(TuningRecordRow.mean_run_sec, TuningRecordRow.id)
            .limit(k)
        )
        if max_record_id is not None:
            query = query.where(TuningRecordRow.id <= max_record_id)
        with self.session_scope(write=False) as s:
            return list(s.scalars(of_owner(query, owner)))

    def all_records(
        self,
        target_key: str,
        workload_ids: Iterable[int] | None = None,
        job_id: str | None = None,
        valid_only: bool = False,
        owner: str | None = None,
    ) -> list[StoredRecord]:
        """A target's records with their workloads, in commit order."""
        query = (
            sa.select(TuningRecordRow.workload_id, WorkloadRow.workload_json, TuningRecordRow.record_json)
            .join(WorkloadRow, WorkloadRow.id == TuningRecordRow.workload_id)
            .where(TuningRecordRow.target_key == target_key)
            .order_by(TuningRecordRow.id)
        )
        if workload_ids is not None:
            ids = list(workload_ids)
            if not ids:
                return []
            query = query.where(TuningRecordRow.workload_id.in_(ids))
        if job_id is not None:
            query = query.where(TuningRecordRow.job_id == job_id)
        if valid_only:
            query = query.where(TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT)
        with self.session_scope(write=False) as s:
            return [
                StoredRecord(wid, wjson, rjson) for wid, wjson, rjson in s.execute(of_owner(query, owner))
            ]

    def records_since(
        self, target_key: str, after_id: int, owner: str | None = None, limit: int = 4096
    ) -> list[NewRecord]:
        """The newest ``limit`` valid records of a target stored after record ``after_id``, oldest first."""
        query = (
            sa.select(
                TuningRecordRow.id,
                TuningRecordRow.job_id,
                TuningRecordRow.workload_id,
                WorkloadRow.workload_json,
                TuningRecordRow.record_json,
            )
            .join(WorkloadRow, WorkloadRow.id == TuningRecordRow.workload_id)
            .where(
                TuningRecordRow.target_key == target_key,
                TuningRecordRow.id > after_id,
                TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT,
            )
            .order_by(TuningRecordRow.id.desc())
            .limit(limit)
        )
        with self.session_scope(write=False) as s:
            return [NewRecord(*row) for row in reversed(s.execute(of_owner(query, owner)).all())]

    def list_records(
        self, job_id: str | None = None, workload_id: int | None = None, target_key: str | None = None
    ) -> list[Record]:
        """Records matching every given filter, in commit order."""
        query = sa.select(TuningRecordRow).order_by(TuningRecordRow.id)
        if job_id is not None:
            query = query.where(TuningRecordRow.job_id == job_id)
        if workload_id is not None:
            query = query.where(TuningRecordRow.workload_id == workload_id)
        if target_key is not None:
            query = query.where(TuningRecordRow.target_key == target_key)
        with self.session_scope(write=False) as s:
            return [record_entity(r) for r in s.scalars(query)]

    def count_records(
        self, target_key: str | None = None, job_id: str | None = None, owner: str | None = None
    ) -> int:
        """Number of records (valid or not) matching the given filters."""
        query = of_owner(sa.select(sa.func.count(TuningRecordRow.id)), owner)
        if target_key is not None:
            query = query.where(TuningRecordRow.target_key == target_key)
        if job_id is not None:
            query = query.where(TuningRecordRow.job_id == job_id)
        with self.session_scope(write=False) as s:
            return int(s.scalar(query) or 0)

    def job_timeline(self, job_id: str, workload_id: int | None = None) -> list[TimelineEntry]:
        """A job's records (of one workload when given), in commit order."""
        query = (
            sa.select(
                TuningRecordRow.id,
                TuningRecordRow.workload_id,
                TuningRecordRow.mean_run_sec,
                TuningRecordRow.created_at,
            )
            .where(TuningRecordRow.job_id == job_id)
            .order_by(TuningRecordRow.id)
        )
        if workload_id is not None:
            query = query.where(TuningRecordRow.workload_id == workload_id)
        with self.session_scope(write=False) as s:
            return [
                TimelineEntry(rid, wid, sec * 1e6 if is_valid(sec) else None, at)
                for rid, wid, sec, at in s.execute(query)
            ]

    def best_latency_before(
        self, workload_id: int, target_key: str, before_record_id: int, owner: str | None = None
    ) -> float | None:
        """The best valid latency (us) of a workload on a target among records older than the given one."""
        query = sa.select(sa.func.min(TuningRecordRow.mean_run_sec)).where(
            TuningRecordRow.workload_id == workload_id,
            TuningRecordRow.target_key == target_key,
            TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT,
            TuningRecordRow.id < before_record_id,
        )
        with self.session_scope(write=False) as s:
            best = s.scalar(of_owner(query, owner))
            return float(best) * 1e6 if best is not None else None

    def job_trial_counts(self, job_id: str) -> dict[int, int]:
        """Per workload: how many records (valid or not) this job measured."""
        query = (
            sa.select(TuningRecordRow.workload_id, sa.func.count(TuningRecordRow.id))
            .where(TuningRecordRow.job_id == job_id)
            .group_by(TuningRecordRow.workload_id)
        )
        with self.session_scope(write=False) as s:
            return {wid: int(n) for wid, n in s.execute(query)}

    def best_record(self, workload_id: int, target_key: str, owner: str | None = None) -> BestRecord | None:
        """A workload's fastest valid record."""
        query = (
            sa.select(WorkloadRow.workload_json, TuningRecordRow.record_json, TuningRecordRow.mean_run_sec)
            .join(WorkloadRow, WorkloadRow.id == TuningRecordRow.workload_id)
            .where(
                TuningRecordRow.workload_id == workload_id,
                TuningRecordRow.target_key == target_key,
                TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT,
            )
            .order_by(TuningRecordRow.mean_run_sec, TuningRecordRow.id)
            .limit(1)
        )
        with self.session_scope(write=False) as s:
            row = s.execute(of_owner(query, owner)).first()
            return BestRecord(row[0], row[1], float(row[2])) if row is not None else None

    def best_latency_us(self, workload_id: int, target_key: str, owner: str | None = None) -> float | None:
        """The fastest valid mean run time of a workload on a target, in microseconds."""
        query = sa.select(sa.func.min(TuningRecordRow.mean_run_sec)).where(
            TuningRecordRow.workload_id == workload_id,
            TuningRecordRow.target_key == target_key,
            TuningRecordRow.mean_run_sec < VALID_RUN_SEC_LIMIT,
        )
        with self.session_scope(write=False) as s:
            best = s.scalar(of_owner(query, owner))
            return float(best) * 1e6 if best is not None else None
