"""The job queue in the store, on SQLite and PostgreSQL: atomic claims, heartbeats, requeue, cancel."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

from tests.store_rows import SIGNATURE, add_job, add_model, spec_for
from tuner.entities import JobStatus, ModelFormat
from tuner.errors import Conflict
from tuner.store import Store
from tuner.store.orm import JobRow, utcnow

TARGET = "llvm -mcpu=znver4 -num-cores=2"


def _age_heartbeat(store: Store, job_id: str, seconds: float) -> None:
    with store.session_scope() as s:
        s.execute(
            sa.update(JobRow)
            .where(JobRow.id == job_id)
            .values(heartbeat_at=utcnow() - timedelta(seconds=seconds))
        )


def test_claim_takes_the_oldest_queued_job_and_counts_the_attempt(store: Store) -> None:
    first, second = add_job(store), add_job(store)
    claimed = store.claim_job("w1")
    assert claimed is not None and claimed.id == first
    assert claimed.status is JobStatus.RUNNING and claimed.worker == "w1" and claimed.attempts == 1
    assert claimed.heartbeat_at is not None and claimed.started_at is not None
    assert store.claim_job("w2").id == second
    assert store.claim_job("w3") is None


def test_workers_racing_for_jobs_never_claim_one_twice(database_url: str, store: Store) -> None:
    model = add_model(store)
    job_ids = {store.create_job(spec_for(model.id, seed=i), TARGET).id for i in range(40)}
    claims: dict[str, list[str]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(name: str) -> None:
        own = Store(database_url)  # its own engine and connections, like a worker on another machine
        try:
            start.wait()
            while (job := own.claim_job(name)) is not None:
                claims.setdefault(job.id, []).append(name)
        except BaseException as exc:  # surfaced below: a thread's failure must fail the test
            errors.append(exc)
        finally:
            own.dispose()

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert set(claims) == job_ids
    assert all(len(names) == 1 for names in claims.values()), {k: v for k, v in claims.items() if len(v) > 1}
    assert store.count_jobs(JobStatus.RUNNING) == 40
    assert all(store.get_job(j).attempts == 1 for j in job_ids)


def test_heartbeat_only_counts_for_the_worker_that_runs_the_job(store: Store) -> None:
    job_id = add_job(store)
    store.claim_job("w1")
    assert store.heartbeat(job_id, "w1") is not None
    assert store.heartbeat(job_id, "w2") is None


def test_stale_job_is_requeued_then_failed_after_max_attempts(store: Store) -> None:
    job_id = add_job(store)
    for attempt in (1, 2):
        assert store.claim_job(f"w{attempt}").attempts == attempt
        assert store.requeue_stale(stale_after_s=30, max_attempts=2) == []  # fresh heartbeat: left alone
        _age_heartbeat(store, job_id, 60)
        [changed] = store.requeue_stale(stale_after_s=30, max_attempts=2)
        if attempt == 1:
            assert (
                changed.status is JobStatus.QUEUED and changed.worker is None and changed.stage == "requeued"
            )
        else:
            assert changed.status is JobStatus.FAILED
            assert "worker w2 stopped heartbeating" in changed.error
            assert "gave up after 2 attempts" in changed.error
    assert store.claim_job("w3") is None


def test_released_job_goes_back_without_counting_the_attempt(store: Store) -> None:
    job_id = add_job(store)
    store.claim_job("w1")
    assert not store.release_job(job_id, "w2")  # not its job
    assert store.release_job(job_id, "w1")
    job = store.get_job(job_id)
    assert job.status is JobStatus.QUEUED and job.attempts == 0 and job.worker is None
    assert store.claim_job("w2").attempts == 1


def test_cancel_of_queued_running_and_finished_jobs(store: Store) -> None:
    queued, running = add_job(store), add_job(store)
    assert store.request_cancel(queued).status is JobStatus.CANCELLED
    store.claim_job("w1")
    asked = store.request_cancel(running)
    assert asked.status is JobStatus.RUNNING and asked.cancel_requested
    assert not store.release_job(running, "w1")  # a job being cancelled is not handed to another worker
    store.finish_job(running, JobStatus.CANCELLED, error="cancelled")
    with pytest.raises(Conflict, match="already finished"):
        store.request_cancel(running)
    with pytest.raises(Conflict, match="already finished"):
        store.request_cancel(queued)


def test_stale_job_with_a_cancel_request_ends_cancelled(store: Store) -> None:
    job_id = add_job(store)
    store.claim_job("w1")
    store.request_cancel(job_id)
    _age_heartbeat(store, job_id, 60)
    [changed] = store.requeue_stale(stale_after_s=30, max_attempts=3)
    assert changed.status is JobStatus.CANCELLED


def test_owners_only_see_their_own_jobs(store: Store) -> None:
    model, _ = store.add_model(
        name="m",
        format=ModelFormat.ONNX,
        sha256="b" * 64,
        size_bytes=1,
        signature=SIGNATURE,
        blob_path="x",
        owner="alice",
    )
    job = store.create_job(spec_for(model.id), TARGET, owner="alice")
    assert store.get_job(job.id, "alice").owner == "alice"
    assert [j.id for j in store.list_jobs(owner="alice")] == [job.id]
    assert store.list_jobs(owner="bob") == [] and store.count_jobs(owner="bob") == 0
    with pytest.raises(Exception, match="not found"):
        store.get_job(job.id, "bob")
    with pytest.raises(Exception, match="not found"):
        store.create_job(spec_for(model.id), TARGET, owner="bob")


def test_service_stats_count_jobs_and_queue_wait(store: Store) -> None:
    add_job(store)
    add_job(store)
    store.claim_job("w1")
    stats = store.service_stats()
    assert stats["jobs"]["queued"] == 1 and stats["jobs"]["running"] == 1
    assert stats["queue_wait_count"] == 1 and stats["queue_wait_sum_s"] >= 0
    assert stats["oldest_queued_wait_s"] >= 0
