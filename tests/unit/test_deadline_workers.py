"""Worker processes whose calls the parent ends by their deadline, even when the worker's own timer
never starts."""

from __future__ import annotations

import operator
import time

import psutil
import pytest

from tuner.metaschedule import deadline_workers
from tuner.metaschedule.deadline_workers import DeadlineWorkers


class _StallsWhenLoaded:
    """An argument whose loading in the worker blocks: before the worker starts the call's timer."""

    def __reduce__(self) -> tuple:
        return (time.sleep, (3600,))


@pytest.fixture
def workers(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(deadline_workers, "GRACE_S", 1.0)
    pool = DeadlineWorkers(2, timeout_s=1.0)
    yield pool
    pool.shutdown()


def test_calls_run_side_by_side_and_return_their_values(workers: DeadlineWorkers) -> None:
    assert workers.run(operator.add, [(40, 2), (1, 2)]) == [42, 3]
    assert workers.run(operator.add, [(5, 5)]) == [10]


def test_a_call_that_raises_returns_its_exception(workers: DeadlineWorkers) -> None:
    failed, fine = workers.run(operator.truediv, [(1, 0), (6, 3)])
    assert isinstance(failed, ZeroDivisionError)
    assert fine == 2.0


def test_a_call_past_its_timeout_in_the_worker_times_out(workers: DeadlineWorkers) -> None:
    slow, fine = workers.run(time.sleep, [(30,), (0,)])
    assert isinstance(slow, TimeoutError)
    assert fine is None


def test_a_worker_stuck_before_its_timer_is_killed_and_replaced(workers: DeadlineWorkers) -> None:
    workers.run(operator.add, [(0, 0), (0, 0)])
    stuck_pid = workers._slots[0].worker._proc.pid
    stuck, fine = workers.run(operator.add, [(_StallsWhenLoaded(), 1), (41, 1)])
    assert isinstance(stuck, TimeoutError)
    assert fine == 42
    assert not psutil.pid_exists(stuck_pid) or psutil.Process(stuck_pid).status() == psutil.STATUS_ZOMBIE
    # The next call gets a fresh worker.
    assert workers.run(operator.add, [(1, 1), (2, 2)]) == [2, 4]
    assert workers._slots[0].worker._proc.pid != stuck_pid


def test_more_calls_than_workers_take_turns_and_a_stuck_one_holds_up_only_itself(
    workers: DeadlineWorkers,
) -> None:
    calls = [(i, 1) for i in range(6)]
    calls[1] = (_StallsWhenLoaded(), 1)
    outcomes = workers.run(operator.add, calls)
    assert isinstance(outcomes[1], TimeoutError)
    assert [o for i, o in enumerate(outcomes) if i != 1] == [1, 3, 4, 5, 6]
