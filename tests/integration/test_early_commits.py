"""Every measured batch is committed before the next one is searched, from the very first batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest

import tuner.tune
from tests.host_jobs import run_host_job
from tests.model_builders import build_mlp
from tuner.entities import FusionSummary, JobStatus, Task
from tuner.jobs.recorder import TuningClock
from tuner.metaschedule.runner import ExclusiveRunner
from tuner.settings import Settings
from tuner.store import Store

pytestmark = pytest.mark.slow


class _CountingRunner:
    """The real runner, counting the batches it is given."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches = 0

    def run(self, runner_inputs: list[Any]) -> list[Any]:
        self.batches += 1
        return self.inner.run(runner_inputs)


class _Watcher:
    """A job listener that notes, at every measured batch, how many batches the runner had been given and
    how many records of the job the database held."""

    def __init__(self, store: Store, runner: dict[str, _CountingRunner]) -> None:
        self.store, self.runner = store, runner
        self.job_id = ""
        self.seen: list[tuple[int, int, str]] = []  # (batches sent, records committed, task)
        self.tasks = 0

    def stage(self, name: str) -> None:
        pass

    def planned(self, tasks: list[Task], fusion: FusionSummary, trials_total: int) -> None:
        self.tasks = len(tasks)
        self.job_id = tasks[0].job_id

    def tuning(self, clock: TuningClock) -> None:
        pass

    def measured(self, task: Task, trials_done: int, trials_total: int) -> None:
        committed = self.store.count_records(job_id=self.job_id)
        self.seen.append((self.runner["it"].batches, committed, task.name))


def test_first_batch_is_committed_before_the_second_task_is_searched(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.from_settings(settings)
    store.ensure_schema()
    runner: dict[str, _CountingRunner] = {}
    make_runner = tuner.tune.make_runner

    def counting_runner(config: Any) -> Any:
        runner["it"] = _CountingRunner(make_runner(config))
        return ExclusiveRunner(runner["it"])

    monkeypatch.setattr(tuner.tune, "make_runner", counting_runner)
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(), str(path))
    watcher = _Watcher(store, runner)
    # The stock space: the search's own first round is under test (cpu-poly measures its seeds before it,
    # all tasks in one batch, by design).
    result = run_host_job(store, settings, path, listener=watcher, trials=8, space="cpu")

    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    assert watcher.tasks >= 2  # more tasks than one batch covers: a first round of several batches
    # The first batch is in the database while it is the only one measured: not after a whole round.
    batches, committed, _ = watcher.seen[0]
    assert batches == 1 and committed > 0
    # And so on for every batch of the first round: each is committed before the next is sent.
    first_round = watcher.seen[: watcher.tasks]
    assert [b for b, _, _ in first_round] == list(range(1, watcher.tasks + 1))
    committed_counts = [c for _, c, _ in first_round]
    assert committed_counts == sorted(set(committed_counts))  # each batch adds its records
    assert len({name for _, _, name in first_round}) == watcher.tasks  # round robin: each task once
    assert store.count_records(job_id=result.job.id) == sum(t.trials for t in result.tasks)
