"""A record this Kiln cannot read (a tensor intrinsic it does not register, stored by a newer worker on a
shared database) is left out by whatever reads the store's records: the cost model catching up, the
search's and the compile's queries for a workload's best records, the export of records; a best schedule it cannot show is refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiln_tvm import tuning_record_json
from tests.ms_workloads import TARGET_KEY, make_job, make_record, matmul, target
from tuner.entities import Task
from tuner.errors import Conflict
from tuner.jobs.artifact import write_records
from tuner.metaschedule.cost_model import keep_cost_model, load_cost_model
from tuner.metaschedule.database import KilnDatabase
from tuner.store import Store
from tuner.views.inspection import best_schedule


def _store_with_a_foreign_record(store: Store) -> tuple[KilnDatabase, list[Any]]:
    """Two workloads with a readable record each, the first also with a faster one naming an intrinsic
    this Kiln does not have."""
    db = KilnDatabase(store, TARGET_KEY)
    mods = [matmul(16), matmul(32)]
    for mod in mods:
        db.commit_tuning_record(make_record(mod, [1e-4]))
    # As a newer worker on a shared database would store it: a trace tensorizing with an intrinsic this
    # Kiln does not register. Its workload is one of the two above.
    foreign = tuning_record_json(make_record(mods[0], [5e-5]))
    block = ["GetSBlock", [], ["C", "main"], ["b0"]]
    foreign[0] = [[block, ["Tensorize", ["b0"], ["kiln_from_a_newer_kiln", 1], []]], []]
    store.add_record(
        workload_id=db.commit_workload_id(mods[0]),
        job_id=None,
        target_key=TARGET_KEY,
        target_json=json.dumps(foreign[2]),
        trace_json=json.dumps(foreign[0]),
        run_secs=[5e-5],
        args_info_json=json.dumps(foreign[3]),
        record_json=json.dumps(foreign),
    )
    return db, mods


def test_a_record_naming_an_intrinsic_this_process_lacks_is_skipped_and_the_rest_learnt(store: Store) -> None:
    _store_with_a_foreign_record(store)
    ranking, last = load_cost_model(store, target(), TARGET_KEY, None)
    stored = store.records_since(TARGET_KEY, 0)
    assert len(stored) == 3 and last == stored[-1].id  # past the foreign record: not retried each job
    assert ranking.model.data_size == 2


def test_the_best_records_of_a_workload_leave_out_one_this_kiln_cannot_read(store: Store) -> None:
    db, mods = _store_with_a_foreign_record(store)
    workload = db.commit_workload(mods[0])
    (best,) = db.get_top_k(workload, 2)  # the foreign record is faster, and left out
    assert [float(x) for x in best.run_secs] == [1e-4]
    assert len(db.get_all_tuning_records()) == 2 and len(db) == 3


def test_exported_records_leave_out_one_this_kiln_cannot_read(store: Store, tmp_path: Path) -> None:
    _store_with_a_foreign_record(store)
    assert write_records(store.all_records(TARGET_KEY), tmp_path, per_workload=2) == 2  # one per workload
    written = (tmp_path / "database_tuning_record.json").read_text()
    assert len(written.splitlines()) == 2 and "kiln_from_a_newer_kiln" not in written


def test_a_best_schedule_this_kiln_cannot_read_is_refused_with_the_reason(store: Store) -> None:
    db, mods = _store_with_a_foreign_record(store)
    job = store.get_job(make_job(store))
    task = Task(1, job.id, db.commit_workload_id(mods[0]), "matmul16", 1, 2 * 16**3, "hash")
    with pytest.raises(Conflict, match="stored by a Kiln with a tensor intrinsic this one does not have"):
        best_schedule(store, job, task)  # the foreign record is the workload's fastest
    other = Task(2, job.id, db.commit_workload_id(mods[1]), "matmul32", 1, 2 * 32**3, "hash")
    assert best_schedule(store, job, other).latency_us == pytest.approx(100.0)


def test_a_kept_model_learns_what_other_processes_of_the_same_job_stored(store: Store) -> None:
    """A split job's groups tune in several processes under one job id: each keeps its model taught every
    record it did not measure itself, the other groups' included (not only other jobs')."""
    job_id = make_job(store)
    ranking, last = load_cost_model(store, target(), TARGET_KEY, None)
    assert last == 0 and ranking.model.data_size == 0
    this_group = KilnDatabase(store, TARGET_KEY, job_id=job_id)
    other_group = KilnDatabase(store, TARGET_KEY, job_id=job_id)
    for secs in (1e-4, 2e-4):
        this_group.commit_tuning_record(make_record(matmul(16), [secs]))
        other_group.commit_tuning_record(make_record(matmul(32), [secs * 2]))
        other_group.commit_tuning_record(make_record(matmul(48), [secs * 3]))
    assert len(this_group.committed_ids) == 2 and len(other_group.committed_ids) == 4
    # This process's model learnt its own records while tuning (here: not at all, to tell them apart).
    kept = keep_cost_model(
        store,
        ranking,
        target(),
        target_key=TARGET_KEY,
        scope=None,
        last=last,
        learnt=this_group.committed_ids,
    )
    assert kept is not None
    assert kept.samples == ranking.model.data_size == 4  # the other group's four, not this one's two
    assert kept.last_record_id == max(other_group.committed_ids)
    # The next job's model starts from them and catches up on nothing learnt twice.
    again, up_to = load_cost_model(store, target(), TARGET_KEY, None)
    assert up_to == kept.last_record_id and again.model.data_size == 4
