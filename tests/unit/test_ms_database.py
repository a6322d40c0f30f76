"""KilnDatabase: MetaSchedule's Database over the store, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from kiln_tvm import ms, register_cpu_tensor_intrinsics, structural_hash, tvm
from tests.ms_workloads import (
    OTHER_TARGET_KEY,
    TARGET_KEY,
    detach_unnamed_ms_log_handlers,
    make_job,
    make_record,
    matmul,
    target,
)
from tuner.metaschedule.database import TRANSFER_REACH, KilnDatabase
from tuner.store import Store

# The builder's worker processes cannot import this test module by name; ship fast_build by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def fast_build(mod: Any, target: Any, _params: Any) -> Any:
    """LocalBuilder's default build without its ~26 s ``import tvm.s_tir.tensor_intrin`` per batch."""
    from kiln_tvm import tvm

    mod = tvm.s_tir.transform.RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.driver.build(mod, target=target)


def mean(record: ms.database.TuningRecord) -> float:
    return float(np.mean([float(x) for x in record.run_secs]))


def test_workloads_are_deduplicated_by_structure(store: Store) -> None:
    db = KilnDatabase(store, TARGET_KEY)
    mod = matmul(64)
    assert not db.has_workload(mod)
    assert db.workload_id(mod) is None
    first = db.commit_workload(mod)
    wid = db.workload_id(mod)
    assert wid is not None
    assert db.commit_workload(mod).same_as(first)
    # A structurally equal module built separately, and a database with a cold cache, find the same row.
    assert db.commit_workload_id(matmul(64)) == wid
    assert KilnDatabase(store, OTHER_TARGET_KEY).workload_id(matmul(64)) == wid
    assert db.has_workload(matmul(64))
    assert not db.has_workload(matmul(32))
    assert db.commit_workload_id(matmul(32)) != wid
    assert len(store.find_workloads(structural_hash(mod))) == 1
    assert "T.sblock" in store.get_workload_script(wid) or "T.block" in store.get_workload_script(wid)


def test_hash_collisions_are_resolved_by_structural_equality(store: Store) -> None:
    mod, other = matmul(64), matmul(32)
    shash = structural_hash(mod)
    # Pretend `other` hashed like `mod`: a row under mod's hash holding a different workload.
    impostor_json = json.dumps(ms.database.Workload(other).as_json())
    impostor = store.add_workload(shash, impostor_json, other.script())
    db = KilnDatabase(store, TARGET_KEY)
    assert db.workload_id(mod) is None
    wid = db.commit_workload_id(mod)
    assert wid != impostor
    assert [w for w, _ in store.find_workloads(shash)] == [impostor, wid]
    assert KilnDatabase(store, TARGET_KEY).workload_id(mod) == wid


def test_records_are_bound_to_target_and_job(store: Store) -> None:
    job_id = make_job(store)
    commits: list[tuple[int, list[float]]] = []
    db = KilnDatabase(store, TARGET_KEY, job_id=job_id, on_commit=lambda w, s: commits.append((w, s)))
    mod = matmul(64)
    workload = db.commit_workload(mod)
    for secs in ([3e-3], [1e10], [1e-3, 1e-3], [2e-3]):
        db.commit_tuning_record(make_record(mod, secs))

    wid = db.workload_id(mod)
    assert commits == [(wid, [3e-3]), (wid, [1e10]), (wid, [1e-3, 1e-3]), (wid, [2e-3])]
    assert len(db) == 4
    assert [mean(r) for r in db.get_top_k(workload, 10)] == pytest.approx([1e-3, 2e-3, 3e-3])
    assert [mean(r) for r in db.get_top_k(workload, 1)] == pytest.approx([1e-3])
    assert db.get_top_k(workload, 0) == []
    assert len(db.get_all_tuning_records()) == 4  # the failed candidate is kept
    records = store.list_records(workload_id=wid)
    assert {(r.job_id, r.target_key) for r in records} == {(job_id, TARGET_KEY)}
    assert db.query_schedule(mod, target(), workload_name="main") is not None

    other = KilnDatabase(store, OTHER_TARGET_KEY)
    assert other.has_workload(mod)  # workloads are shared ...
    assert len(other) == 0  # ... records are not
    assert other.get_top_k(other.commit_workload(mod), 5) == []
    assert other.get_all_tuning_records() == []
    assert other.query_tuning_record(mod, target(), workload_name="main") is None
    assert other.query_schedule(mod, target(), workload_name="main") is None

    # Another job on the same target starts warm from these records.
    warm = KilnDatabase(store, TARGET_KEY, job_id=make_job(store, TARGET_KEY))
    assert len(warm.get_top_k(warm.commit_workload(matmul(64)), 3)) == 3


def test_a_failing_on_commit_hook_does_not_lose_the_record(store: Store) -> None:
    def broken(_workload_id: int, _run_secs: list[float]) -> None:
        raise RuntimeError("progress endpoint down")

    db = KilnDatabase(store, TARGET_KEY, on_commit=broken)
    db.commit_tuning_record(make_record(matmul(64), [1e-3]))
    assert len(db) == 1


def test_similar_records_are_the_same_operator_at_the_nearest_other_shape(store: Store) -> None:
    db = KilnDatabase(store, TARGET_KEY, job_id=make_job(store))
    for n, secs in ((64, 1e-4), (128, 5e-3), (256, 4e-2)):
        db.commit_tuning_record(make_record(matmul(n), [secs]))
    db.commit_tuning_record(make_record(matmul(128), [6e-3]))  # a slower second record of 128
    KilnDatabase(store, OTHER_TARGET_KEY).commit_tuning_record(make_record(matmul(96), [1e-3]))
    # A workload stored before families were kept: its family is computed when first looked for.
    legacy = matmul(80)
    store.add_workload(structural_hash(legacy), json.dumps(ms.database.Workload(legacy).as_json()), "#")
    db.commit_tuning_record(make_record(legacy, [2e-4]))

    similar = KilnDatabase(store, TARGET_KEY).similar_records(matmul(100), k=3)
    # Nearest first (80, 128, 64), each workload's best record, none of the other target, and not 256:
    # more than twice as far per iterator (the reach).
    assert TRANSFER_REACH == 1.0
    assert [tuple(r.args_info[0].shape)[0] for r in similar] == [80, 128, 64]
    assert [float(r.run_secs[0]) for r in similar] == pytest.approx([2e-4, 5e-3, 1e-4])
    # From 128: 80, then 256 and 64 (both exactly twice as far: the newer first).
    assert [tuple(r.args_info[0].shape)[0] for r in db.similar_records(matmul(128), k=5)] == [80, 256, 64]
    assert db.similar_records(matmul(100), k=0) == []
    assert db.similar_records(matmul(1024), k=3) == []  # nothing within reach


def test_anchor_records_are_the_same_operator_under_another_epilogue(store: Store) -> None:
    db = KilnDatabase(store, TARGET_KEY, job_id=make_job(store))
    for n, relu, secs in ((32, True, 1e-4), (256, True, 4e-2), (64, False, 2e-3), (128, False, 5e-3)):
        db.commit_tuning_record(make_record(matmul(n, relu), [secs]))
    KilnDatabase(store, OTHER_TARGET_KEY).commit_tuning_record(make_record(matmul(96, True), [1e-3]))
    # A workload stored before anchors were kept (its family known): its anchor is computed when needed.
    legacy = matmul(100, relu=True)
    store.add_workload(
        structural_hash(legacy), json.dumps(ms.database.Workload(legacy).as_json()), "#", family="old"
    )
    db.commit_tuning_record(make_record(legacy, [3e-4]))

    anchored = KilnDatabase(store, TARGET_KEY).anchor_records(matmul(120), k=3)
    # The ReLU matmuls only (the plain ones are matmul(120)'s own family), none of the other target, and
    # of those only 100 within reach: 256 and 32 are more than twice as far per iterator.
    assert [tuple(r.args_info[0].shape)[0] for r in anchored] == [100]
    assert [float(r.run_secs[0]) for r in anchored] == pytest.approx([3e-4])
    # Nearest first: 128, then 64 (0.91 apart per iterator).
    assert [tuple(r.args_info[0].shape)[0] for r in db.anchor_records(matmul(120, True), k=3)] == [128, 64]
    assert [tuple(r.args_info[0].shape)[0] for r in db.anchor_records(matmul(200, True), k=3)] == [128]
    assert db.anchor_records(matmul(120), k=0) == []


@pytest.mark.slow
def test_tune_tir_writes_records_that_survive_a_reopen(store: Store, tmp_path: Path) -> None:
    register_cpu_tensor_intrinsics()
    job_id = make_job(store)
    committed: list[int] = []
    db = KilnDatabase(store, TARGET_KEY, job_id=job_id, on_commit=lambda w, s: committed.append(w))
    mod, tgt = matmul(64), target()
    detach_unnamed_ms_log_handlers()
    ms.tune_tir(
        mod=mod,
        target=tgt,
        work_dir=str(tmp_path / "work"),
        max_trials_global=8,
        num_trials_per_iter=8,
        database=db,
        builder=ms.builder.LocalBuilder(max_workers=1, f_build=fast_build),
        runner=ms.runner.LocalRunner(
            evaluator_config=ms.runner.EvaluatorConfig(
                number=2, repeat=1, min_repeat_ms=5, enable_cpu_cache_flush=False
            )
        ),
        cost_model=ms.cost_model.RandomModel(),
        strategy=ms.search_strategy.EvolutionarySearch(population_size=32, genetic_num_iters=1),
        num_tuning_cores=1,
        seed=0,
    )
    assert committed, "tuning committed no record"
    assert not list((tmp_path / "work").glob("database_*.json")), "records went to a JSON database"

    # A new process would see exactly this: a new engine and a new database object with a cold cache.
    reopened = Store(store.url)
    try:
        again = KilnDatabase(reopened, TARGET_KEY)
        assert len(again) == len(committed) == reopened.count_records(job_id=job_id)
        records = reopened.list_records(job_id=job_id)
        assert {(r.job_id, r.target_key) for r in records} == {(job_id, TARGET_KEY)}
        assert any(r.mean_latency_us is not None for r in records)

        sch = again.query_schedule(matmul(64), tgt, workload_name="main")
        assert sch is not None
        assert len(sch.trace.insts) > 0
        lib = tvm.compile(sch.mod, target=tgt)
        rng = np.random.default_rng(0)
        a, b = (rng.standard_normal((64, 64), dtype=np.float32) for _ in range(2))
        out = tvm.runtime.tensor(np.zeros((64, 64), np.float32))
        lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
        np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)

        elsewhere = KilnDatabase(reopened, OTHER_TARGET_KEY)
        assert elsewhere.query_schedule(matmul(64), tgt, workload_name="main") is None
        assert len(elsewhere) == 0
    finally:
        reopened.dispose()
