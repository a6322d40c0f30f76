"""Which RPC servers a job measured on, batch by batch: what the devices page shows as servers in use."""

from __future__ import annotations

import pytest

from tests.store_rows import add_job
from tuner.entities import JobStatus
from tuner.errors import NotFound
from tuner.store import Store


def test_batches_add_up_per_server_and_only_running_jobs_are_in_use(store: Store) -> None:
    first, second = add_job(store), add_job(store)
    store.mark_job_running(first, "w1")
    store.note_server_use(first, "board", {"10.0.0.1:9090": 2, "10.0.0.2:9090": 2})
    store.note_server_use(first, "board", {"10.0.0.1:9090": 1})
    store.note_server_use(second, "board", {"10.0.0.2:9090": 3})  # a queued job: not running
    store.note_server_use(first, "board", {})  # a local batch measures on no server

    uses = {(u.job_id, u.server): u for u in store.server_uses()}
    assert {k: u.candidates for k, u in uses.items()} == {
        (first, "10.0.0.1:9090"): 3,
        (first, "10.0.0.2:9090"): 2,
        (second, "10.0.0.2:9090"): 3,
    }
    again = uses[first, "10.0.0.1:9090"]
    assert again.key == "board" and again.first_used_at <= again.last_used_at
    assert uses[first, "10.0.0.2:9090"].last_used_at <= again.last_used_at  # noted before the last batch

    running = store.server_uses(running_only=True)
    assert {(u.job_id, u.server) for u in running} == {(first, "10.0.0.1:9090"), (first, "10.0.0.2:9090")}
    assert all(u.job_status is JobStatus.RUNNING for u in running)
    assert running[0].server == "10.0.0.1:9090"  # the latest first

    store.finish_job(first, JobStatus.SUCCEEDED)
    assert store.server_uses(running_only=True) == []
    assert {u.server for u in store.server_uses(job_id=first)} == {"10.0.0.1:9090", "10.0.0.2:9090"}


def test_a_use_of_an_unknown_job_is_refused(store: Store) -> None:
    with pytest.raises(NotFound):
        store.note_server_use("no-such-job", "board", {"10.0.0.1:9090": 1})
