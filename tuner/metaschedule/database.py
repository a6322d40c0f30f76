"""MetaSchedule's ``Database`` interface over Kiln's store, bound to one canonical target.

MetaSchedule's ``query_tuning_record`` ignores the target it is given and takes the best record of the
workload, whatever CPU it was measured on. A :class:`KilnDatabase` therefore only ever reads and writes
the records of its own ``target_key``: a schedule tuned for one CPU is never applied to another.
Workloads (a task's TIR) are shared by every target and job, so a task seen before starts warm.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable

from kiln_tvm import (
    SCHEDULE_ERRORS,
    derived_object,
    ms,
    register_cpu_tensor_intrinsics,
    structural_equal,
    structural_hash,
    tuning_record_json,
    tvm,
)
from schedules.transfer import anchor_family, iteration_extents, shape_distance, within_reach, workload_family
from tuner.entities import StoredWorkload
from tuner.store.sql import Store

log = logging.getLogger(__name__)

Workload = ms.database.Workload
TuningRecord = ms.database.TuningRecord

OnCommit = Callable[[int, list[float]], None]

#: How far (|log2| of the ratio of their extents, on every iterator) a similar workload's shape may be
#: from the new one for its record to be transferred: a tiling of a far shape is a guess, and the
#: polyhedral model's (next in the order of trust) knows the shape. Without it, GPT-2's 128x768x3072
#: matmuls took the record of MobileNetV2's 1x1280x2 classifier GEMV (the only matmul+add in the store)
#: and ran 58-82 ms each, the model 728 ms against 75 ms cold; and ResNet-18's 3x3 convolutions took the
#: decisions of MobileNetV2's 1x1 ones, 22.0 ms in all against 18.0 ms with the model's tilings (Zen 4,
#: 2026-12-05, summed kernel latencies).
TRANSFER_REACH = 1.0


@derived_object
class KilnDatabase(ms.database.PyDatabase):
    """A MetaSchedule database that keeps workloads and records in a :class:`Store`.

    ``target_key`` is the canonical target the records belong to; ``job_id`` is written on every record
    this database commits (records of other jobs on the same target are still read: that is warm start).
    ``owner`` limits what it reads to the records of that owner's jobs (None: every record);
    ``max_record_id`` limits the records it ranks (``get_top_k``, ``similar_records``) to those stored up
    to that one: the store as it was then, to build a model from what a job had measured by some moment.
    ``on_commit(workload_id, run_secs)`` runs after each record is stored, e.g. to report progress.
    """

    def __init__(
        self,
        store: Store,
        target_key: str,
        *,
        job_id: str | None = None,
        on_commit: OnCommit | None = None,
        owner: str | None = None,
        max_record_id: int | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.max_record_id = max_record_id
        self.target_key = target_key
        self.job_id = job_id
        self.owner = owner
        self.on_commit = on_commit
        # Deserializing a workload parses its whole IRModule; keep each one once, and keep it alive
        # because MetaSchedule holds on to the objects we return.
        self._workloads: dict[int, Workload] = {}
        self._ids_by_hash: dict[str, list[int]] = {}
        #: The ids of the records this database stored, in commit order: what this process measured (a
        #: kept cost model learnt them while tuning, and must learn every other record stored meanwhile).
        self.committed_ids: list[int] = []

    # ---- workloads ---------------------------------------------------------------------------------

    def _remember(self, shash: str, workload_id: int, workload: Workload) -> Workload:
        if workload_id not in self._workloads:
            self._workloads[workload_id] = workload
            self._ids_by_hash.setdefault(shash, []).append(workload_id)
        return self._workloads[workload_id]

    def _load(self, workload_id: int, workload_json: str) -> Workload:
        cached = self._workloads.get(workload_id)
        if cached is not None:
            return cached
        data = json.loads(workload_json)
        return self._remember(str(data[0]), workload_id, Workload.from_json(data))

    def _find(self, mod: tvm.IRModule) -> tuple[int, Workload] | None:
        """The stored workload structurally equal to ``mod``: hash lookup, then equality (hashes collide)."""
        shash = structural_hash(mod)
        for workload_id in self._ids_by_hash.get(shash, []):
            workload = self._workloads[workload_id]
            if structural_equal(workload.mod, mod):
                return workload_id, workload
        for stored in self.store.find_workloads(shash):
            if stored.id in self._workloads:
                continue
            workload = self._load(stored.id, stored.workload_json)
            if structural_equal(workload.mod, mod):
                return stored.id, workload
        return None

    def stored_workload(self, workload_id: int) -> Workload:
        """The stored workload ``workload_id`` (a task's TIR, as the job that planned it committed it)."""
        return self._load(workload_id, self.store.get_workload_json(workload_id))

    def workload_id(self, mod: tvm.IRModule) -> int | None:
        """The id of the stored workload for ``mod``, if any."""
        found = self._find(mod)
        return found[0] if found is not None else None

    def commit_workload_id(self, mod: tvm.IRModule) -> int:
        """Store ``mod`` as a workload if it is new; returns its id."""
        found = self._find(mod)
        if found is not None:
            return found[0]
        workload = Workload(mod)
        shash = structural_hash(mod)
        workload_id = self.store.add_workload(
            shash,
            json.dumps(workload.as_json()),
            mod.script(),
            workload_family(mod),
            anchor_family(mod) or "",
        )
        self._remember(shash, workload_id, workload)
        return workload_id

    def similar_records(self, mod: tvm.IRModule, k: int = 3) -> list[TuningRecord]:
        """The best record of each of the ``k`` stored workloads of ``mod``'s family (the same operator
        at other shapes) measured on this database's target, the nearest shape first, none further than
        :data:`TRANSFER_REACH`; ``mod`` itself is left out. Workloads stored before families were kept
        get theirs computed here, once."""
        family = workload_family(mod)
        if family is None or k <= 0:
            return []
        self._compute_missing_families()
        stored = self.store.family_workloads(
            family, self.target_key, self.owner, max_record_id=self.max_record_id
        )
        return self._nearest_best(mod, stored, k, anchor_only=False)

    def anchor_records(self, mod: tvm.IRModule, k: int = 3) -> list[TuningRecord]:
        """As :meth:`similar_records`, for the stored workloads sharing ``mod``'s anchor (its first
        reduction block) under another fused epilogue, the nearest anchor shape first, none further than
        :data:`TRANSFER_REACH`; workloads of ``mod``'s own family are left out (:meth:`similar_records` has
        them)."""
        anchor = anchor_family(mod)
        if anchor is None or k <= 0:
            return []
        self._compute_missing_families()
        family = workload_family(mod)
        stored = [
            w
            for w in self.store.anchor_workloads(
                anchor, self.target_key, self.owner, max_record_id=self.max_record_id
            )
            if workload_family(self._load(w.id, w.workload_json).mod) != family
        ]
        return self._nearest_best(mod, stored, k, anchor_only=True)

    def _nearest_best(
        self,
        mod: tvm.IRModule,
        stored: list[StoredWorkload],
        k: int,
        anchor_only: bool,
    ) -> list[TuningRecord]:
        own = self.workload_id(mod)
        extents = iteration_extents(mod, anchor_only)
        ranked: list[tuple[float, int, Workload]] = []
        for row in stored:
            if row.id == own:
                continue
            workload = self._load(row.id, row.workload_json)
            theirs = iteration_extents(workload.mod, anchor_only)
            if not within_reach(extents, theirs, TRANSFER_REACH):
                continue
            ranked.append((shape_distance(extents, theirs), row.id, workload))
        ranked.sort(key=lambda item: (item[0], -item[1]))
        records = []
        for _, _, workload in ranked[:k]:
            records.extend(self.get_top_k(workload, 1))
        return records

    def _compute_missing_families(self) -> None:
        missing = self.store.workloads_without_family(self.target_key)
        if missing:
            mods = {w.id: self._load(w.id, w.workload_json).mod for w in missing}
            self.store.set_workload_families(
                {wid: workload_family(mod) or "" for wid, mod in mods.items()},
                {wid: anchor_family(mod) or "" for wid, mod in mods.items()},
            )

    # ---- PyDatabase interface ----------------------------------------------------------------------

    def has_workload(self, mod: tvm.IRModule) -> bool:
        """Whether ``mod`` is a stored workload (on any target)."""
        return self._find(mod) is not None

    def commit_workload(self, mod: tvm.IRModule) -> Workload:
        """The workload for ``mod``, stored first if it is new."""
        return self._workloads[self.commit_workload_id(mod)]

    def commit_tuning_record(self, record: TuningRecord) -> None:
        """Store one measured candidate for this database's target and job, in its own transaction."""
        workload_id = self.commit_workload_id(record.workload.mod)
        record_json = tuning_record_json(record)
        trace_json, run_secs, target_json, args_info_json = record_json
        secs = [float(x) for x in run_secs or []]
        record_id = self.store.add_record(
            workload_id=workload_id,
            job_id=self.job_id,
            target_key=self.target_key,
            target_json=json.dumps(target_json),
            trace_json=json.dumps(trace_json),
            run_secs=secs,
            args_info_json=json.dumps(args_info_json),
            record_json=json.dumps(record_json),
        )
        self.committed_ids.append(record_id)
        if self.on_commit is not None:
            try:
                self.on_commit(workload_id, secs)
            except Exception:
                # The record is safely stored; a failing progress hook must not abort a long tuning run.
                log.exception("on_commit hook failed for workload %d", workload_id)

    def get_top_k(self, workload: Workload, top_k: int) -> list[TuningRecord]:
        """The ``top_k`` fastest valid records of ``workload`` on this database's target."""
        if top_k <= 0:
            return []
        found = self._find(workload.mod)
        if found is None:
            return []
        rows = self.store.top_records(found[0], self.target_key, top_k, self.owner, self.max_record_id)
        return _readable((row, workload) for row in rows)

    def get_all_tuning_records(self) -> list[TuningRecord]:
        """Every record (valid or failed) of this database's target, in commit order."""
        return _readable(
            (row.record_json, self._load(row.workload_id, row.workload_json))
            for row in self.store.all_records(self.target_key, owner=self.owner)
        )

    def __len__(self) -> int:
        """Number of records of this database's target."""
        return self.store.count_records(target_key=self.target_key, owner=self.owner)


def readable_record(record_json: str, workload: Workload) -> TuningRecord | None:
    """The stored record ``record_json`` of ``workload``, or None (with a warning) when this process cannot
    read it: a tensor intrinsic it does not register, from a newer worker on a shared database. Such a
    record must not fail the search, the compile or the export that asked for a workload's records.

    Every stored record is read here, so the CPU tensor intrinsics a trace may tensorize with are registered
    here (AMX's only for a record that names one: they take seconds to parse)."""
    register_cpu_tensor_intrinsics(amx="kiln_amx_" in record_json)
    try:
        return TuningRecord.from_json(json.loads(record_json), workload)
    except SCHEDULE_ERRORS as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[-1]
        if reason not in _unreadable_reasons:  # once per reason and process: searches ask every round
            _unreadable_reasons.add(reason)
            log.warning("stored records this Kiln cannot read are left out: %s", reason)
        return None


_unreadable_reasons: set[str] = set()


def _readable(rows: Iterable[tuple[str, Workload]]) -> list[TuningRecord]:
    """The records of ``rows`` (record JSON, workload) this process can read (:func:`readable_record`)."""
    return [record for record in (readable_record(*row) for row in rows) if record is not None]


__all__ = ["KilnDatabase", "OnCommit", "readable_record"]
