"""Jobs: their spec (budget, target, runner), their state, their tasks and their artifact."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tuner.entities.outcome import AccuracyReport, LatencyReport
from tuner.entities.quantization import AccuracyBudget
from tuner.errors import InvalidSpec

DEFAULT_TRIALS = 64  # a job's trial budget when it gives neither trials nor a time budget
MAX_JOB_WORKERS = 64  # the most workers one job's tasks may be split over
#: The cost models a job may ask for (tuner.tune.make_cost_model).
COST_MODELS = ("xgb", "random")
#: The precision policies a job may ask for (tuner.passes.precision): ``as-is`` changes nothing; ``auto`` is
#: ``bf16`` or ``as-is`` by the CPU; ``int8`` quantizes a float model (tuner.quantization) within the job's
#: accuracy budget.
PRECISIONS = ("as-is", "auto", "bf16", "fp16", "int8")
#: The calibration methods of the int8 policy (tuner.quantization.onnx_quantizer).
CALIBRATION_METHODS = ("minmax", "percentile", "entropy")


def check_cost_model(name: str) -> None:
    """Refuse a cost model Kiln does not have (at submit, not later on a worker)."""
    if name not in COST_MODELS:
        raise InvalidSpec(f"unknown cost model {name!r}; use one of {', '.join(map(repr, COST_MODELS))}")


def check_precision(policy: str) -> None:
    """:class:`~tuner.errors.InvalidSpec` for a precision policy Kiln does not know."""
    if policy not in PRECISIONS:
        raise InvalidSpec(f"unknown precision {policy!r}; choose one of {', '.join(PRECISIONS)}")


def check_quantization_fields(method: str, budget: AccuracyBudget) -> None:
    """:class:`~tuner.errors.InvalidSpec` for an unknown calibration method or a budget out of range."""
    if method not in CALIBRATION_METHODS:
        raise InvalidSpec(
            f"unknown calibration method {method!r}; choose one of {', '.join(CALIBRATION_METHODS)}"
        )
    if not 0.0 <= budget.max_top1_changed <= 1.0:
        raise InvalidSpec(f"max_top1_changed is a share from 0 to 1, got {budget.max_top1_changed!r}")
    if not 0.0 < budget.max_relative_error < math.inf:
        raise InvalidSpec(f"max_relative_error must be a positive number, got {budget.max_relative_error!r}")


def trial_budget(trials: int | None, time_budget_s: float | None) -> int | None:
    """The trials of a job asked for with ``trials`` and ``time_budget_s``: as given; DEFAULT_TRIALS when
    neither is given; no limit (None) with a time budget alone."""
    return DEFAULT_TRIALS if trials is None and time_budget_s is None else trials


class JobStatus(str, enum.Enum):
    """Life cycle of a tuning job."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


_RUNNER_TIMEOUTS = ("session_timeout_s", "queue_timeout_s", "timeout_s")


@dataclass(frozen=True)
class RunnerSpec:
    """Where a job's candidates are measured: this machine (``local``), or the TVM RPC servers registered
    at ``tracker`` (host:port) under ``key`` (``rpc``).

    An rpc runner's waits are bounded by ``session_timeout_s`` (one candidate's session on a server),
    ``queue_timeout_s`` (waiting for a busy server) and ``timeout_s`` (one question to the tracker);
    None takes the defaults of :mod:`tuner.metaschedule.rpc_runner`.
    """

    kind: str = "local"
    tracker: str = ""
    key: str = ""
    session_timeout_s: int | None = None
    queue_timeout_s: float | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("local", "rpc"):
            raise InvalidSpec(
                f"unknown runner kind {self.kind!r}; use {{'kind': 'local'}} or {{'kind': 'rpc', ...}}"
            )
        if self.kind == "rpc" and not (self.tracker and self.key and isinstance(self.key, str)):
            raise InvalidSpec("an rpc runner needs 'tracker' (host:port) and a device 'key'")
        if any(t is not None and t <= 0 for t in self._timeouts().values()):
            raise InvalidSpec("rpc runner timeouts must be positive")

    @property
    def is_local(self) -> bool:
        return self.kind == "local"

    def _timeouts(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in _RUNNER_TIMEOUTS}

    def to_dict(self) -> dict[str, Any]:
        """The JSON form a job's spec stores and the API shows."""
        if self.is_local:
            return {"kind": "local"}
        timeouts = {name: value for name, value in self._timeouts().items() if value is not None}
        return {"kind": self.kind, "tracker": self.tracker, "key": self.key, **timeouts}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RunnerSpec:
        """A runner from its JSON form (``{"kind": "local"}``, or ``{"kind": "rpc", "tracker", "key"}``
        with optional timeouts); InvalidSpec for anything else."""
        if not data:
            return cls()
        if not isinstance(data, Mapping):
            raise InvalidSpec(f"a runner is a JSON object, not {data!r}")
        unknown = set(data) - {"kind", "tracker", "key", *_RUNNER_TIMEOUTS}
        if unknown:
            raise InvalidSpec(f"unknown runner field(s) {sorted(unknown)}")
        try:
            return cls(
                kind=str(data.get("kind", "local")),
                tracker=str(data.get("tracker") or ""),
                key=data.get("key") or "",
                session_timeout_s=_optional(int, data.get("session_timeout_s")),
                queue_timeout_s=_optional(float, data.get("queue_timeout_s")),
                timeout_s=_optional(float, data.get("timeout_s")),
            )
        except (TypeError, ValueError) as err:
            raise InvalidSpec(f"bad runner {dict(data)!r}: {err}") from None


def _optional(convert: Any, value: Any) -> Any:
    return None if value is None else convert(value)


@dataclass(frozen=True)
class JobSpec:
    """What a user asks to have tuned."""

    model_id: str
    target: dict[str, Any]
    trials: int | None  # None: no trial limit; the time budget ends the search
    max_trials_per_task: int | None = None
    seed: int = 0
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    runner: RunnerSpec = field(default_factory=RunnerSpec)
    cost_model: str = "xgb"
    time_budget_s: float | None = None  # seconds of tuning (search, build, measure) over all attempts
    #: The schedule space (schedules.spaces); None until submission resolves the target's default.
    space: str | None = None
    #: The precision policy for float matmuls and convolutions (tuner.passes.precision): as-is, bf16 or fp16.
    precision: str = "as-is"
    #: A stored float model this (quantized or reduced-precision) one stands for: the accuracy report
    #: adds the top-1 agreement of the tuned build with it.
    float_model_id: str | None = None
    #: How many workers may tune this job's tasks at once (tuner.jobs.task_groups): its tasks are split in
    #: that many groups, which idle workers claim; 1 tunes them all in the job's own worker.
    workers: int = 1
    #: The int8 policy's calibration and validation inputs (a kept .npz, by its sha256); None: synthetic.
    calibration_id: str | None = None
    #: How the int8 policy calibrates the activations' ranges: minmax, percentile or entropy.
    calibration_method: str = "minmax"
    #: How far the int8 policy's model may stray from the float model on the validation samples.
    accuracy_budget: AccuracyBudget = field(default_factory=AccuracyBudget)

    def __post_init__(self) -> None:
        if type(self.workers) is not int or not 1 <= self.workers <= MAX_JOB_WORKERS:
            raise InvalidSpec(f"workers must be an integer from 1 to {MAX_JOB_WORKERS}, got {self.workers!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "target": self.target,
            "trials": self.trials,
            "max_trials_per_task": self.max_trials_per_task,
            "seed": self.seed,
            "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
            "runner": self.runner.to_dict(),
            "cost_model": self.cost_model,
            "time_budget_s": self.time_budget_s,
            "space": self.space,
            "precision": self.precision,
            "float_model_id": self.float_model_id,
            "workers": self.workers,
            "calibration_id": self.calibration_id,
            "calibration_method": self.calibration_method,
            "accuracy_budget": self.accuracy_budget.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        trials = data.get("trials")
        return cls(
            model_id=data["model_id"],
            target=data["target"],
            trials=None if trials is None else int(trials),
            max_trials_per_task=data.get("max_trials_per_task"),
            seed=int(data.get("seed", 0)),
            input_shapes={k: tuple(v) for k, v in (data.get("input_shapes") or {}).items()},
            runner=RunnerSpec.from_dict(data.get("runner")),
            cost_model=data.get("cost_model", "xgb"),
            time_budget_s=data.get("time_budget_s"),
            space=data.get("space"),
            precision=data.get("precision") or "as-is",
            float_model_id=data.get("float_model_id"),
            workers=data.get("workers", 1),
            calibration_id=data.get("calibration_id"),
            calibration_method=data.get("calibration_method") or "minmax",
            accuracy_budget=AccuracyBudget.from_dict(data.get("accuracy_budget")),
        )


@dataclass(frozen=True)
class Job:
    """A tuning job and its outcome."""

    id: str
    spec: JobSpec
    target_key: str
    status: JobStatus
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    baseline_latency_ms: float | None = None
    tuned_latency_ms: float | None = None
    worker: str | None = None
    attempts: int = 0
    owner: str = ""
    heartbeat_at: datetime | None = None
    cancel_requested: bool = False
    stage: str | None = None  # what a running job is doing: importing, tuning, compiling...
    trials_done: int = 0
    trials_total: int = 0
    reference_latency_ms: dict[str, float] = field(default_factory=dict)  # e.g. {"onnxruntime": 0.1}
    latency_report: LatencyReport | None = None  # how the latencies above were measured
    accuracy: AccuracyReport | None = None  # quantized models: the outputs against onnxruntime
    tuning_s: float = 0.0  # seconds spent tuning, all attempts, up to ``tuning_since``
    tuning_since: datetime | None = None  # while tuning: when ``tuning_s`` was last brought up to date

    def tuning_elapsed_s(self, now: datetime) -> float:
        """Seconds this job has spent tuning, counting the running stretch up to ``now``."""
        tuning_now = self.status is JobStatus.RUNNING and self.stage == "tuning"
        if self.tuning_since is None or not tuning_now:  # a dead worker's stretch is not counted
            return self.tuning_s
        return self.tuning_s + max(0.0, (now - self.tuning_since).total_seconds())

    def tuning_remaining_s(self, now: datetime) -> float | None:
        """Seconds left of the job's time budget (never below 0), or None when it has none."""
        if self.spec.time_budget_s is None:
            return None
        return max(0.0, self.spec.time_budget_s - self.tuning_elapsed_s(now))

    @property
    def speedup(self) -> float | None:
        """Untuned TVM over tuned."""
        if self.baseline_latency_ms and self.tuned_latency_ms:
            return self.baseline_latency_ms / self.tuned_latency_ms
        return None

    @property
    def peer(self) -> str | None:
        """The runtime a user would otherwise use that the job measured beside Kiln (onnxruntime first)."""
        peers = sorted(self.reference_latency_ms or {}, key=lambda name: (name != "onnxruntime", name))
        return peers[0] if peers else None

    @property
    def peer_speedup(self) -> float | None:
        """The peer's latency over the tuned model's: the headline figure (> 1: Kiln is faster)."""
        peer = self.peer
        if peer is None or not self.tuned_latency_ms:
            return None
        return self.reference_latency_ms[peer] / self.tuned_latency_ms


def trials_shortfall(job: Job, tasks: list[Task]) -> str | None:
    """Why a finished job measured fewer trials than it asked for (None: it did not, or it is not finished):
    its time budget ended, or the search had no new candidate left for tasks whose schedule spaces are
    smaller than their share of the trials (a transpose has a handful of schedules, not dozens)."""
    asked = job.spec.trials
    done = sum(t.trials for t in tasks)
    if job.status is not JobStatus.SUCCEEDED or asked is None or done >= asked:
        return None
    budget = job.spec.time_budget_s
    if budget is not None and job.tuning_s >= budget - 1.0:
        return f"{done} of the {asked} trials were measured: the {budget:g} s time budget ended first"
    fewest = sorted(tasks, key=lambda t: (t.trials, t.name))[:3]
    names = ", ".join(f"{t.name}: {t.trials}" for t in fewest)
    return (
        f"{done} of the {asked} trials were measured: the search had no new candidate left to measure for "
        f"tasks whose schedule spaces are smaller than their share of the trials (fewest trials: {names})"
    )


@dataclass(frozen=True)
class Task:
    """One task of a job, with its tuning progress."""

    id: int
    job_id: str
    workload_id: int
    name: str
    weight: int
    flops: float
    workload_hash: str
    trials: int = 0
    best_latency_us: float | None = None
    #: What the space's hooks did in this task's search (cpu-poly: examined, rejected, passed_through,
    #: seeds, and the caches they held tiles against), when the space keeps statistics.
    search_stats: dict[str, Any] | None = None
    #: Where the schedule compiled into the job's model came from: ``tuned`` (a measured record),
    #: ``similar`` (a record of the same operator at another shape), ``rule``, ``model`` (the polyhedral
    #: model's tiling), ``sampled`` or ``none``; None until the job compiled.
    schedule_source: str | None = None

    @property
    def gflops(self) -> float | None:
        """The throughput of its best schedule, or None while unknown (no latency, or a NaN one)."""
        if not self.best_latency_us or not self.flops or math.isnan(self.best_latency_us):
            return None
        return self.flops / (self.best_latency_us * 1e-6) / 1e9


@dataclass(frozen=True)
class Artifact:
    """A compiled, verified model package of a job."""

    id: int
    job_id: str
    path: str
    sha256: str
    size_bytes: int
    created_at: datetime


@dataclass(frozen=True)
class ServerUse:
    """The candidates one job measured on one RPC server of a device key, and when it last did."""

    key: str
    server: str  # host:port, as Kiln's server names itself ("?" for a server that is not Kiln's)
    job_id: str
    owner: str
    job_status: JobStatus
    candidates: int
    first_used_at: datetime
    last_used_at: datetime


class TaskGroupStatus(str, enum.Enum):
    """Life cycle of a group of a split job's tasks (:class:`TaskGroup`)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (TaskGroupStatus.DONE, TaskGroupStatus.FAILED)


@dataclass(frozen=True)
class TaskGroup:
    """Some of a split job's tasks, tuned by whichever worker claims the group.

    ``task_indices`` are positions in the job's task list; ``trials`` is the group's share of the job's
    trial budget (None: the time budget alone bounds it); ``deadline_at`` is when the job's time budget
    ends (None: no time budget). Claimed, heartbeated and requeued like a job.
    """

    id: int
    job_id: str
    index: int
    task_indices: tuple[int, ...]
    trials: int | None
    status: TaskGroupStatus
    worker: str | None = None
    attempts: int = 0
    heartbeat_at: datetime | None = None
    deadline_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
