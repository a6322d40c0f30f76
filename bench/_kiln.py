"""Kiln's product path for the benchmarks: register, submit, run a job; unpack its artifact.

Also builds the untuned baseline (``tuner.compile.build_untuned``, i.e. plain ``tvm.compile``) of the
same imported model and exports it to a ``.so``, so that both are timed the same way in a fresh process.
"""

from __future__ import annotations

import json
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.compile import build_untuned, random_inputs
from tuner.entities import FusionSummary, JobSpec, Task
from tuner.frontend import load_model
from tuner.jobs.pipeline import run_job
from tuner.jobs.recorder import TuningClock
from tuner.jobs.submission import submit_job
from tuner.metaschedule.database import KilnDatabase
from tuner.model_registry import register_model
from tuner.quantization.calibration_files import save_calibration
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.targets import resolve_target, to_tvm_target


class _StageClock:
    """A job listener that times each stage and prints tuning progress to stderr."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.stages: dict[str, float] = {}
        self._current: tuple[str, float] | None = None
        self.tasks = 0
        self.warm_tasks = 0
        self._last_print = 0.0
        self.clock: TuningClock | None = None

    def stage(self, name: str) -> None:
        now = time.perf_counter()
        self.close(now)
        self._current = (name, now)
        print(f"  [{self.label}] {name}", file=sys.stderr, flush=True)

    def close(self, now: float | None = None) -> None:
        """End the current stage (call once more when the job returns)."""
        if self._current is not None:
            name, start = self._current
            self.stages[name] = self.stages.get(name, 0.0) + (now or time.perf_counter()) - start
            self._current = None

    def planned(self, tasks: list[Task], fusion: FusionSummary, trials_total: int) -> None:
        self.tasks = len(tasks)
        self.warm_tasks = sum(1 for t in tasks if t.best_latency_us is not None)
        print(
            f"  [{self.label}] {len(tasks)} tasks, {trials_total} trials "
            f"({fusion.operators_before} operators -> {fusion.kernels_after} kernels)",
            file=sys.stderr,
            flush=True,
        )

    def tuning(self, clock: TuningClock) -> None:
        self.clock = clock

    def measured(self, task: Task, trials_done: int, trials_total: int) -> None:
        now = time.perf_counter()
        if now - self._last_print > 10 or (trials_total and trials_done >= trials_total):
            self._last_print = now
            spent = f", {self.clock.elapsed_s():.0f} s tuning" if self.clock is not None else ""
            print(
                f"  [{self.label}] {trials_done}/{trials_total or '-'} trials{spent}",
                file=sys.stderr,
                flush=True,
            )


@dataclass
class KilnRun:
    """What one Kiln job produced, with the paths the benchmark needs."""

    job_id: str
    model_so: Path  # the artifact's model.so, extracted
    untuned_so: Path
    input_names: list[str]
    inputs: dict[str, Any]  # Kiln's own seeded inputs (name -> array); benchmarks may use others
    trials: int | None  # None: a time budget only
    trials_done: int
    tasks: int
    warm_tasks: int
    job_wall_s: float  # run_job, end to end: import, tune, compile, verify, package
    stage_s: dict[str, float]
    model_flops: float  # Kiln's per-task FLOP estimate x task weight, summed
    manifest: dict[str, Any] = field(default_factory=dict)


def tune(
    onnx_path: Path,
    data_dir: Path,
    trials: int | None,
    label: str,
    seed: int = 0,
    time_s: float | None = None,
    precision: str = "as-is",
    calibration: Path | None = None,
) -> KilnRun:
    """Tune ``onnx_path`` for this CPU with Kiln (a fresh store under ``data_dir``) for ``trials``, ``time_s``
    seconds or both, under the ``precision`` policy (with ``calibration``, an .npz of inputs, as the
    user's calibration file); build the untuned twin."""
    settings = Settings(data_dir=data_dir)
    store = Store.from_settings(settings)
    store.ensure_schema()
    info, _ = register_model(store, settings, onnx_path, name=label)
    calibration_id = save_calibration(settings, calibration.read_bytes()).id if calibration else None
    spec = JobSpec(
        model_id=info.id,
        target=resolve_target("host"),
        trials=trials,
        seed=seed,
        time_budget_s=time_s,
        precision=precision,
        calibration_id=calibration_id,
    )
    job = submit_job(store, spec)
    clock = _StageClock(label)
    start = time.perf_counter()
    result = run_job(store, settings, job.id, listener=clock)
    wall = time.perf_counter() - start
    clock.close()
    if result.artifact is None:
        raise RuntimeError(f"Kiln job {job.id} finished {result.job.status.value} without an artifact")

    unpacked = data_dir / "unpacked" / job.id
    _extract(Path(result.artifact.path), unpacked)
    manifest = json.loads((unpacked / "manifest.json").read_text())

    imported = load_model(onnx_path)
    untuned_so = data_dir / "untuned" / f"{label}.so"
    untuned_so.parent.mkdir(parents=True, exist_ok=True)
    build_untuned(imported.mod, to_tvm_target(result.job.spec.target)).export_library(str(untuned_so))

    names = [t.name for t in imported.signature.inputs]
    return KilnRun(
        job_id=job.id,
        model_so=unpacked / "model.so",
        untuned_so=untuned_so,
        input_names=names,
        inputs=dict(zip(names, random_inputs(imported.signature, seed), strict=True)),
        trials=trials,
        trials_done=sum(t.trials for t in result.tasks),
        tasks=clock.tasks,
        warm_tasks=clock.warm_tasks,
        job_wall_s=wall,
        stage_s=clock.stages,
        model_flops=sum(t.flops * t.weight for t in result.tasks),
        manifest=manifest,
    )


def _extract(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python < 3.10.12 has no extraction filters; the archive is our own
            tar.extractall(dest)


def import_records(sources: list[Store], target_key: str, into: Store) -> int:
    """Copy the valid records of ``sources`` (their workloads too) into ``into``; the last record's id."""
    database = KilnDatabase(into, target_key)
    for source in sources:
        for record in KilnDatabase(source, target_key).get_all_tuning_records():
            secs = [float(s) for s in record.run_secs or []]
            if secs and max(secs) < 1e9:
                database.commit_tuning_record(record)
    ids = [r.id for r in into.list_records(target_key=target_key)]
    return max(ids, default=0)
