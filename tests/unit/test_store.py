"""Store tests, run on SQLite and (when KILN_TEST_DATABASE_URL is set) on PostgreSQL."""

from __future__ import annotations

import json
import math
import threading
from datetime import timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.exc import DBAPIError

from tests.store_rows import SIGNATURE, TARGET, add_job, add_model, add_record, spec_for
from tuner.entities import (
    JobStatus,
    ModelFormat,
    StoredCostModel,
)
from tuner.errors import Conflict, NotFound, SchemaOutdated
from tuner.settings import Settings
from tuner.store import Store, alembic_config
from tuner.store.orm import Base, ModelRow, utcnow
from tuner.store.sql import normalize_url

OTHER_TARGET = "llvm -mcpu=skylake-avx512 -num-cores=4"


def assert_utc(value: object) -> None:
    assert value is not None
    assert value.tzinfo is not None  # type: ignore[attr-defined]
    assert value.utcoffset() == timedelta(0)  # type: ignore[attr-defined]


# ---- schema ----------------------------------------------------------------------------------------


def test_ensure_schema_creates_a_fresh_database(database_url: str) -> None:
    store = Store(database_url)
    try:
        assert store.current_revision() is None
        store.ensure_schema()
        assert store.current_revision() == store.head_revision()
        with store.engine.connect() as conn:
            assert set(Base.metadata.tables) <= set(sa.inspect(conn).get_table_names())
        store.ensure_schema()  # idempotent on a current schema
    finally:
        store.dispose()


def test_ensure_schema_without_auto_create_refuses_an_empty_database(database_url: str) -> None:
    store = Store(database_url)
    try:
        with pytest.raises(SchemaOutdated, match="run `kiln db upgrade`"):
            store.ensure_schema(auto_create=False)
        assert store.current_revision() is None
    finally:
        store.dispose()


def test_ensure_schema_refuses_an_older_revision(store: Store) -> None:
    with store.engine.begin() as conn:
        command.stamp(alembic_config(conn), "base")  # tables stay, the revision goes back
    head = store.head_revision()
    with pytest.raises(SchemaOutdated) as info:
        store.ensure_schema()
    assert str(info.value) == f"database schema is at revision none, Kiln needs {head}: run `kiln db upgrade`"
    assert store.current_revision() is None  # not silently "fixed"


def test_ensure_schema_refuses_an_unknown_revision(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'ffff0000'"))
    with pytest.raises(SchemaOutdated, match="revision ffff0000, which this version of Kiln does not know"):
        store.ensure_schema()


def test_migrations_downgrade_and_upgrade_again(store: Store) -> None:
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    with store.engine.connect() as conn:
        assert not set(Base.metadata.tables) & set(sa.inspect(conn).get_table_names())
    store.upgrade()
    assert store.current_revision() == store.head_revision()
    add_model(store)


def test_records_of_the_old_intrinsic_names_are_renamed_by_the_migration(store: Store) -> None:
    wid = store.add_workload("7", "[]", "# tir")
    trace = [[["Annotate", ["b0"], ["meta_schedule.auto_tensorize", "dot_16x4_vnni"], []]], []]
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0009")
    rid = store.add_record(
        workload_id=wid,
        job_id=None,
        target_key=TARGET,
        target_json="{}",
        trace_json=json.dumps(trace),
        run_secs=[1e-5],
        args_info_json="[]",
        record_json=json.dumps([trace, [1e-5], {}, []]),
    )
    store.upgrade()
    with store.engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT trace_json, record_json FROM tuning_records WHERE id = :id"), {"id": rid}
        ).one()
    for text in row:
        assert '"kiln_dot_16x4_vnni"' in text and '"dot_16x4_vnni"' not in text


def test_orm_models_match_the_migrations(store: Store) -> None:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_from_settings_creates_the_data_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "nested" / "data", database_url=None)
    store = Store.from_settings(settings)
    try:
        assert settings.data_dir.is_dir()
        store.ensure_schema()
        assert (settings.data_dir / "kiln.db").is_file()
        assert store.backend == "sqlite"
    finally:
        store.dispose()


def test_bare_postgresql_urls_use_psycopg() -> None:
    assert normalize_url("postgresql://u@h:5432/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgres://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgresql+psycopg://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("sqlite:///x.db").drivername == "sqlite"


def test_settings_fixture_points_at_tmp_path(settings: Settings, tmp_path: Path) -> None:
    assert settings.data_dir == tmp_path
    assert settings.resolved_database_url.startswith("sqlite:///")


def test_sqlite_pragmas(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    finally:
        store.dispose()


# ---- sessions and errors ---------------------------------------------------------------------------


def test_integrity_error_becomes_conflict(store: Store) -> None:
    model = add_model(store)
    row = ModelRow(
        name="dup",
        format="onnx",
        sha256=model.sha256,
        size_bytes=1,
        signature_json="{}",
        blob_path="x",
    )
    with pytest.raises(Conflict, match="conflicts with data already stored"), store.session_scope() as s:
        s.add(row)
    with pytest.raises(Conflict, match="custom message"), store.session_scope(conflict="custom message") as s:
        s.add(
            ModelRow(
                name="d", format="onnx", sha256=model.sha256, size_bytes=1, signature_json="{}", blob_path="x"
            )
        )
    assert len(store.list_models()) == 1


def test_session_scope_rolls_back_on_error(store: Store) -> None:
    with pytest.raises(RuntimeError), store.session_scope() as s:
        s.add(
            ModelRow(
                name="n", format="onnx", sha256="b" * 64, size_bytes=1, signature_json="{}", blob_path="x"
            )
        )
        s.flush()
        raise RuntimeError("boom")
    assert store.find_model_by_sha256("b" * 64) is None


def test_other_database_errors_pass_through(store: Store) -> None:
    with pytest.raises(DBAPIError) as info, store.session_scope() as s:
        s.execute(sa.text("SELECT * FROM no_such_table"))
    assert not isinstance(info.value, sa.exc.IntegrityError)


def test_foreign_keys_are_enforced(store: Store) -> None:
    with pytest.raises(Conflict):
        add_record(store, workload_id=12345, run_secs=[1e-3])


# ---- models ----------------------------------------------------------------------------------------


def test_add_model_and_read_it_back(store: Store) -> None:
    model, created = store.add_model(
        name="resnet",
        format=ModelFormat.TORCH_EXPORT,
        sha256="c" * 64,
        size_bytes=99,
        signature=SIGNATURE,
        blob_path="models/cc.pt2",
    )
    assert created
    assert len(model.id) == 32
    assert model.format is ModelFormat.TORCH_EXPORT
    assert model.signature == SIGNATURE
    assert_utc(model.created_at)
    assert store.get_model(model.id) == model
    assert store.find_model_by_sha256("c" * 64) == model
    assert store.find_model_by_sha256("d" * 64) is None
    assert store.model_blob_path(model.id) == "models/cc.pt2"


def test_duplicate_sha256_returns_the_existing_model(store: Store) -> None:
    first, created = store.add_model(
        name="a", format=ModelFormat.ONNX, sha256="e" * 64, size_bytes=1, signature=SIGNATURE, blob_path="p1"
    )
    again, created_again = store.add_model(
        name="b", format=ModelFormat.ONNX, sha256="e" * 64, size_bytes=1, signature=SIGNATURE, blob_path="p2"
    )
    assert created and not created_again
    assert again == first
    assert store.model_blob_path(first.id) == "p1"
    assert [m.id for m in store.list_models()] == [first.id]


def test_list_models_newest_first(store: Store) -> None:
    a = add_model(store, "1" * 64, "a")
    b = add_model(store, "2" * 64, "b")
    assert [m.id for m in store.list_models()] == [b.id, a.id]


def test_model_not_found(store: Store) -> None:
    with pytest.raises(NotFound) as info:
        store.get_model("nope")
    assert str(info.value) == "model 'nope' not found"
    with pytest.raises(NotFound, match="model 'nope' not found"):
        store.model_blob_path("nope")
    with pytest.raises(NotFound, match="model 'nope' not found"):
        store.create_job(spec_for("nope"), TARGET)


def test_concurrent_uploads_of_the_same_bytes_make_one_model(store: Store) -> None:
    results: list[tuple[str, bool]] = []
    errors: list[BaseException] = []

    def upload() -> None:
        try:
            model, created = store.add_model(
                name="m",
                format=ModelFormat.ONNX,
                sha256="f" * 64,
                size_bytes=1,
                signature=SIGNATURE,
                blob_path="p",
            )
            results.append((model.id, created))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=upload) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({mid for mid, _ in results}) == 1
    assert sum(created for _, created in results) == 1


# ---- jobs ------------------------------------------------------------------------------------------


def test_create_and_get_job(store: Store) -> None:
    model = add_model(store)
    spec = spec_for(model.id, max_trials_per_task=16, seed=3)
    job = store.create_job(spec, TARGET)
    assert job.status is JobStatus.QUEUED
    assert job.spec == spec
    assert job.target_key == TARGET
    assert job.attempts == 0
    assert job.started_at is None and job.finished_at is None and job.worker is None
    assert_utc(job.created_at)
    assert store.get_job(job.id) == job


def test_job_not_found(store: Store) -> None:
    for call in (
        lambda: store.get_job("x"),
        lambda: store.mark_job_running("x", "w"),
        lambda: store.finish_job("x", JobStatus.FAILED),
        lambda: store.update_job_progress("x", 1, 2),
        lambda: store.job_progress("x"),
        lambda: store.add_tasks("x", []),
        lambda: store.add_artifact("x", "p", "s", 1),
    ):
        with pytest.raises(NotFound, match="job 'x' not found"):
            call()


def test_list_jobs_newest_first_with_filter_and_paging(store: Store) -> None:
    ids = [add_job(store) for _ in range(4)]
    store.mark_job_running(ids[1], "w1")
    assert [j.id for j in store.list_jobs()] == ids[::-1]
    assert [j.id for j in store.list_jobs(status=JobStatus.RUNNING)] == [ids[1]]
    assert [j.id for j in store.list_jobs(status=JobStatus.QUEUED)] == [ids[3], ids[2], ids[0]]
    assert [j.id for j in store.list_jobs(limit=2)] == [ids[3], ids[2]]
    assert [j.id for j in store.list_jobs(limit=2, offset=2)] == [ids[1], ids[0]]
    assert store.list_jobs(status=JobStatus.SUCCEEDED) == []


def test_job_life_cycle(store: Store) -> None:
    job_id = add_job(store)
    running = store.mark_job_running(job_id, "worker-1")
    assert running.status is JobStatus.RUNNING
    assert running.worker == "worker-1"
    assert running.attempts == 1
    assert_utc(running.started_at)
    with pytest.raises(Conflict, match=f"job '{job_id}' is running; only a queued job can start"):
        store.mark_job_running(job_id, "worker-2")
    assert store.get_job(job_id).worker == "worker-1"

    done = store.finish_job(job_id, JobStatus.SUCCEEDED, baseline_latency_ms=30.0, tuned_latency_ms=1.5)
    assert done.status is JobStatus.SUCCEEDED
    assert done.baseline_latency_ms == 30.0 and done.tuned_latency_ms == 1.5
    assert done.speedup == pytest.approx(20.0)
    assert done.error is None
    assert_utc(done.finished_at)
    assert done.finished_at >= done.started_at  # type: ignore[operator]
    with pytest.raises(Conflict, match="already finished \\(succeeded\\)"):
        store.finish_job(job_id, JobStatus.CANCELLED)
    assert store.get_job(job_id).status is JobStatus.SUCCEEDED


def test_finish_job_with_error_and_cancel_a_queued_job(store: Store) -> None:
    failed = add_job(store)
    store.mark_job_running(failed, "w")
    job = store.finish_job(failed, JobStatus.FAILED, error="kernel crashed")
    assert job.status is JobStatus.FAILED and job.error == "kernel crashed"

    cancelled = add_job(store)
    assert store.finish_job(cancelled, JobStatus.CANCELLED).status is JobStatus.CANCELLED
    with pytest.raises(Conflict, match="is cancelled; only a queued job can start"):
        store.mark_job_running(cancelled, "w")
    with pytest.raises(ValueError, match="final status"):
        store.finish_job(add_job(store), JobStatus.RUNNING)


def test_job_progress(store: Store) -> None:
    job_id = add_job(store)
    assert store.job_progress(job_id) == {
        "trials_done": 0,
        "trials_total": 0,
        "tasks_done": 0,
        "tasks_total": 0,
    }
    wid = store.add_workload("1", "[]", "# tir")
    tasks = store.add_tasks(
        job_id, [{"name": f"t{i}", "weight": 1, "flops": 1.0, "workload_id": wid} for i in range(3)]
    )
    store.update_job_progress(job_id, 8, 64)
    store.update_task(tasks[0].id, trials=8, best_latency_us=None)
    store.update_task(tasks[1].id, trials=0, best_latency_us=12.0)  # warm start from earlier records
    assert store.job_progress(job_id) == {
        "trials_done": 8,
        "trials_total": 64,
        "tasks_done": 2,
        "tasks_total": 3,
    }


# ---- workloads and tasks ---------------------------------------------------------------------------


def test_workloads(store: Store) -> None:
    a = store.add_workload("123", '["123", "AAA"]', "# a")
    assert store.add_workload("123", '["123", "AAA"]', "# a") == a  # identical: reused
    b = store.add_workload("123", '["123", "BBB"]', "# b")  # hash collision: a second row
    c = store.add_workload("456", '["456", "CCC"]', "# c")
    assert len({a, b, c}) == 3
    assert store.find_workloads("123") == [(a, '["123", "AAA"]'), (b, '["123", "BBB"]')]
    assert store.find_workloads("789") == []
    assert store.get_workload_script(c) == "# c"
    with pytest.raises(NotFound, match="workload 999999 not found"):
        store.get_workload_script(999999)


def test_concurrent_add_workload_makes_one_row(store: Store) -> None:
    ids: list[int] = []
    barrier = threading.Barrier(6)

    def add() -> None:
        barrier.wait()
        ids.append(store.add_workload("42", '["42", "X"]', "# x"))

    threads = [threading.Thread(target=add) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 6 and len(set(ids)) == 1
    assert len(store.find_workloads("42")) == 1


def test_tasks(store: Store) -> None:
    job_id = add_job(store)
    w1 = store.add_workload("111", "[1]", "# 1")
    w2 = store.add_workload("222", "[2]", "# 2")
    first = store.add_tasks(
        job_id,
        [
            {"name": "fused_matmul_add", "weight": 2, "flops": 2e6, "workload_id": w1},
            {"name": "fused_conv2d_relu", "weight": 1, "flops": 5e6, "workload_id": w2},
        ],
    )
    more = store.add_tasks(job_id, [{"name": "mean", "weight": 1, "flops": 10.0, "workload_id": w1}])
    assert [t.name for t in first + more] == ["fused_matmul_add", "fused_conv2d_relu", "mean"]
    assert [t.workload_hash for t in first + more] == ["111", "222", "111"]
    assert all(t.job_id == job_id and t.trials == 0 and t.best_latency_us is None for t in first + more)
    assert store.list_tasks(job_id) == first + more
    assert store.list_tasks(add_job(store)) == []

    updated = store.update_task(first[1].id, trials=16, best_latency_us=50.0)
    assert updated.trials == 16 and updated.best_latency_us == 50.0
    assert updated.gflops == pytest.approx(5e6 / 50e-6 / 1e9)
    assert store.list_tasks(job_id)[1] == updated


def test_task_errors(store: Store) -> None:
    job_id = add_job(store)
    with pytest.raises(NotFound, match="workload 777 not found"):
        store.add_tasks(job_id, [{"name": "t", "weight": 1, "flops": 1.0, "workload_id": 777}])
    assert store.list_tasks(job_id) == []
    with pytest.raises(NotFound, match="task 555 not found"):
        store.update_task(555, trials=1, best_latency_us=None)


# ---- tuning records --------------------------------------------------------------------------------


def test_top_records_order_validity_and_target(store: Store) -> None:
    job_id = add_job(store)
    w = store.add_workload("1", "[1]", "#")
    other_w = store.add_workload("2", "[2]", "#")
    slow = add_record(store, w, [3e-3, 3e-3], job_id=job_id)
    fast = add_record(store, w, [1e-3], job_id=job_id)
    add_record(store, w, [1e10], job_id=job_id, error="build failed")  # failed candidate
    mid = add_record(store, w, [2e-3])
    add_record(store, w, [0.5e-3], target_key=OTHER_TARGET)  # faster, but for another CPU
    add_record(store, other_w, [0.1e-3])  # another workload

    def run_secs(record_json: str) -> list[float]:
        return json.loads(record_json)[1]

    top = store.top_records(w, TARGET, 10)
    assert [run_secs(r) for r in top] == [[1e-3], [2e-3], [3e-3, 3e-3]]
    assert [run_secs(r) for r in store.top_records(w, TARGET, 1)] == [[1e-3]]
    assert store.top_records(w, TARGET, 0) == []
    assert [run_secs(r) for r in store.top_records(w, OTHER_TARGET, 5)] == [[0.5e-3]]
    assert store.top_records(w, "llvm -mcpu=nothing", 5) == []
    assert store.best_latency_us(w, TARGET) == pytest.approx(1000.0)
    assert store.best_latency_us(w, OTHER_TARGET) == pytest.approx(500.0)
    assert store.best_latency_us(w, "llvm -mcpu=nothing") is None
    assert len({slow, fast, mid}) == 3


def test_failed_candidates_are_kept_but_never_best(store: Store) -> None:
    w = store.add_workload("1", "[1]", "#")
    add_record(store, w, [1e10], error="Cannot broadcast lanes=16 to 64")
    add_record(store, w, [])
    add_record(store, w, [math.nan])
    records = store.list_records(workload_id=w)
    assert len(records) == 3
    assert all(r.mean_latency_us is None for r in records)
    assert records[0].error == "Cannot broadcast lanes=16 to 64"
    assert store.top_records(w, TARGET, 5) == []
    assert store.best_latency_us(w, TARGET) is None
    assert store.count_records(TARGET) == 3


def test_all_records_filters(store: Store) -> None:
    job_a = add_job(store)
    job_b = add_job(store)
    w1 = store.add_workload("1", "[1]", "#")
    w2 = store.add_workload("2", "[2]", "#")
    add_record(store, w1, [1e-3], job_id=job_a)
    add_record(store, w2, [2e-3], job_id=job_b)
    add_record(store, w1, [1e10], job_id=job_b)
    add_record(store, w1, [4e-3], target_key=OTHER_TARGET)

    rows = store.all_records(TARGET)
    assert [(wid, wjson) for wid, wjson, _ in rows] == [(w1, "[1]"), (w2, "[2]"), (w1, "[1]")]
    assert [json.loads(r)[1] for _, _, r in rows] == [[1e-3], [2e-3], [1e10]]
    assert [wid for wid, _, _ in store.all_records(TARGET, workload_ids=[w1])] == [w1, w1]
    assert store.all_records(TARGET, workload_ids=[]) == []
    assert [wid for wid, _, _ in store.all_records(TARGET, job_id=job_b)] == [w2, w1]
    assert [wid for wid, _, _ in store.all_records(TARGET, valid_only=True)] == [w1, w2]
    assert [json.loads(r)[1] for _, _, r in store.all_records(OTHER_TARGET)] == [[4e-3]]


def test_list_and_count_records(store: Store) -> None:
    job_id = add_job(store)
    w = store.add_workload("1", "[1]", "#")
    rid = add_record(store, w, [1e-3, 3e-3], job_id=job_id)
    add_record(store, w, [5e-3], target_key=OTHER_TARGET)

    (record,) = store.list_records(job_id=job_id)
    assert record.id == rid
    assert record.workload_id == w and record.job_id == job_id and record.target_key == TARGET
    assert record.run_secs == (1e-3, 3e-3)
    assert record.mean_latency_us == pytest.approx(2000.0)
    assert record.trace[0][0][0] == "GetSBlock"
    assert record.error is None
    assert_utc(record.created_at)
    assert record.created_at <= utcnow()
    assert record.created_at.tzinfo == timezone.utc

    assert len(store.list_records()) == 2
    assert len(store.list_records(workload_id=w)) == 2
    assert [r.target_key for r in store.list_records(target_key=OTHER_TARGET)] == [OTHER_TARGET]
    assert store.list_records(workload_id=w, target_key=TARGET, job_id=job_id) == [record]
    assert store.count_records() == 2
    assert store.count_records(target_key=TARGET) == 1
    assert store.count_records(job_id=job_id) == 1
    assert store.count_records(target_key=OTHER_TARGET, job_id=job_id) == 0


# ---- artifacts -------------------------------------------------------------------------------------


def test_artifacts(store: Store) -> None:
    job_id = add_job(store)
    with pytest.raises(NotFound) as info:
        store.get_artifact(job_id)
    assert str(info.value) == f"artifact of job '{job_id}' not found"
    artifact = store.add_artifact(job_id, f"jobs/{job_id}/model.so", "9" * 64, 4096)
    assert artifact.job_id == job_id and artifact.size_bytes == 4096
    assert_utc(artifact.created_at)
    assert store.get_artifact(job_id) == artifact
    with pytest.raises(Conflict) as conflict:
        store.add_artifact(job_id, "other.so", "8" * 64, 1)
    assert str(conflict.value) == f"job '{job_id}' already has an artifact"
    assert store.get_artifact(job_id) == artifact


def test_family_workloads_are_those_measured_on_the_target_most_recent_first(store: Store) -> None:
    mine, theirs = (
        store.create_job(spec_for(add_model(store, sha * 64, owner=owner).id), TARGET, owner=owner).id
        for sha, owner in (("b", "ann"), ("c", "bob"))
    )
    old = store.add_workload("1", "[1]", "#", family="f")
    new = store.add_workload("2", "[2]", "#", family="f")
    failed = store.add_workload("3", "[3]", "#", family="f")
    elsewhere = store.add_workload("4", "[4]", "#", family="f")
    other_family = store.add_workload("5", "[5]", "#", family="g")
    add_record(store, old, [1e-3], job_id=mine)
    add_record(store, new, [2e-3], job_id=theirs)
    add_record(store, failed, [1e10], job_id=mine, error="build failed")  # never measured validly
    add_record(store, elsewhere, [1e-3], target_key=OTHER_TARGET)
    add_record(store, other_family, [1e-3], job_id=mine)
    add_record(store, old, [3e-3], job_id=mine)  # measured again, after `new`

    assert [w.id for w in store.family_workloads("f", TARGET)] == [old, new]
    assert [w.id for w in store.family_workloads("f", TARGET, limit=1)] == [old]
    assert [w.id for w in store.family_workloads("f", TARGET, owner="bob")] == [new]
    assert [w.id for w in store.family_workloads("f", OTHER_TARGET)] == [elsewhere]
    assert store.family_workloads("h", TARGET) == []
    assert [w.workload_json for w in store.family_workloads("g", TARGET)] == ["[5]"]


def test_workloads_stored_before_families_get_theirs_once(store: Store) -> None:
    legacy = store.add_workload("1", "[1]", "#")  # no family, measured on the target
    unmeasured = store.add_workload("2", "[2]", "#")
    add_record(store, legacy, [1e-3])
    assert [w.id for w in store.workloads_without_family(TARGET)] == [legacy]
    assert store.workloads_without_family(OTHER_TARGET) == []
    store.set_workload_families({legacy: "f"})
    # Its anchor (stored since 0014) is still missing: it is listed until that is computed too.
    assert [w.id for w in store.workloads_without_family(TARGET)] == [legacy]
    store.set_workload_families({}, {legacy: "a"})
    assert store.workloads_without_family(TARGET) == []
    assert [w.id for w in store.family_workloads("f", TARGET)] == [legacy]  # the family was kept
    assert [w.id for w in store.anchor_workloads("a", TARGET)] == [legacy]
    store.set_workload_families({unmeasured: ""}, {unmeasured: ""})  # none: not computed again
    assert store.family_workloads("", TARGET) == [] and store.anchor_workloads("", TARGET) == []


def test_anchor_workloads_are_those_measured_on_the_target_most_recent_first(store: Store) -> None:
    old = store.add_workload("1", "[1]", "#", family="f", anchor="a")
    new = store.add_workload("2", "[2]", "#", family="g", anchor="a")
    failed = store.add_workload("3", "[3]", "#", family="h", anchor="a")
    other = store.add_workload("4", "[4]", "#", family="f", anchor="b")
    add_record(store, old, [1e-3])
    add_record(store, new, [2e-3])
    add_record(store, failed, [1e10])  # an invalid measurement: not a record to start from
    add_record(store, other, [1e-3])
    assert [w.id for w in store.anchor_workloads("a", TARGET)] == [new, old]
    assert [w.id for w in store.anchor_workloads("a", TARGET, limit=1)] == [new]
    assert store.anchor_workloads("a", OTHER_TARGET) == []


def test_a_cost_model_is_kept_per_target_and_scope_and_never_replaced_by_an_older_one(store: Store) -> None:
    assert store.get_cost_model(TARGET, "") is None
    assert store.save_cost_model(StoredCostModel(TARGET, "", 120, 40, b"first"))
    assert store.save_cost_model(StoredCostModel(TARGET, "*", 300, 90, b"shared"))
    kept = store.get_cost_model(TARGET, "")
    assert kept is not None and (kept.samples, kept.last_record_id, kept.model_tar) == (120, 40, b"first")
    assert kept.trained_at is not None
    # A worker that trained on older records (up to 30) does not replace a model that saw up to 40.
    assert not store.save_cost_model(StoredCostModel(TARGET, "", 100, 30, b"stale"))
    assert store.get_cost_model(TARGET, "").model_tar == b"first"
    assert store.save_cost_model(StoredCostModel(TARGET, "", 150, 55, b"newer"))
    assert store.get_cost_model(TARGET, "").model_tar == b"newer"
    assert store.get_cost_model(TARGET, "*").model_tar == b"shared"
    assert store.get_cost_model(OTHER_TARGET, "") is None


def test_records_since_are_the_newest_valid_records_after_one(store: Store) -> None:
    job_id = add_job(store)
    w = store.add_workload("1", '["1"]', "#")
    first = add_record(store, w, [1e-3], job_id=job_id)
    add_record(store, w, [1e10], error="build failed")
    second = add_record(store, w, [2e-3])
    add_record(store, w, [3e-3], target_key=OTHER_TARGET)
    third = add_record(store, w, [4e-3], job_id=job_id)
    assert [r.id for r in store.records_since(TARGET, 0)] == [first, second, third]
    assert [r.id for r in store.records_since(TARGET, first)] == [second, third]
    assert [r.id for r in store.records_since(TARGET, 0, limit=2)] == [second, third]  # the newest two
    since = store.records_since(TARGET, second)
    assert [(r.job_id, r.workload_id, r.workload_json) for r in since] == [(job_id, w, '["1"]')]
    assert json.loads(since[0].record_json)[1] == [4e-3]


def test_record_queries_see_the_store_as_it_was_up_to_a_record(store: Store) -> None:
    w = store.add_workload("1", "[1]", "#", family="f")
    other = store.add_workload("2", "[2]", "#", family="f")
    slow = add_record(store, w, [3e-3])
    fast = add_record(store, w, [1e-3])
    add_record(store, other, [2e-3])

    def run_secs(record_json: str) -> list[float]:
        return json.loads(record_json)[1]

    assert [run_secs(r) for r in store.top_records(w, TARGET, 5, max_record_id=slow)] == [[3e-3]]
    assert [run_secs(r) for r in store.top_records(w, TARGET, 5, max_record_id=fast)] == [[1e-3], [3e-3]]
    assert store.top_records(w, TARGET, 5, max_record_id=0) == []
    assert [x.id for x in store.family_workloads("f", TARGET, max_record_id=fast)] == [w]
    assert [x.id for x in store.family_workloads("f", TARGET)] == [other, w]
