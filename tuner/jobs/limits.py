"""The bounds of a running job: the memory of its whole process tree and the time of each of its stages.

A job runs in a process of its own (a worker's tuning process, or ``kiln tune`` itself) that starts more
(builders, runners, the processes that time the model): a limit on one process does not bound the job.
:class:`JobWatch` is asked a few times a second, by whoever supervises the job, whether the job is still
within its limits: the proportional set size (PSS: shared pages divided among their sharers, so that the
forked processes that share TVM's libraries are not counted many times over) of the job's process and
all its descendants against ``KILN_JOB_MEMORY_MB``, and the time of its current stage against that
stage's limit. The answer is the reason to stop the job, worded for its user, or None.

Importing the model and extracting its tasks are held to the limits of a preview (``KILN_IMPORT_*``),
which does the same work, so that a job fails with the reason its preview gave.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import psutil

from tuner.isolation.sandbox import SandboxLimits
from tuner.settings import Settings

# The stages that do a preview's work, timed together against the preview's limit.
PLANNING_STAGES = frozenset({"importing", "extracting tasks"})
TUNING_STAGE = "tuning"


@dataclass(frozen=True)
class JobLimits:
    """What one job may use: memory for its process tree, wall-clock time per stage."""

    memory_mb: int
    tuning_s: float  # tuning without a time budget of its own
    stage_s: float  # every other stage; tuning's grace past its time budget
    preview: SandboxLimits  # the limits of a preview, which planning shares

    @classmethod
    def from_settings(cls, settings: Settings) -> JobLimits:
        return cls(
            memory_mb=settings.job_memory_mb,
            tuning_s=settings.job_tuning_timeout_s,
            stage_s=settings.job_stage_timeout_s,
            preview=SandboxLimits.from_settings(settings),
        )

    @property
    def planning_s(self) -> float:
        """How long importing and extracting tasks may take together: a preview's wall-clock limit."""
        return self.preview.timeout_s

    def stage_limit(self, stage: str | None, time_budget_s: float | None) -> tuple[float, str]:
        """How long ``stage`` may take, and the reason a job that takes longer fails with."""
        if stage in PLANNING_STAGES:
            return self.planning_s, self.preview.too_long(f"{self.planning_s:g} s").message
        if stage == TUNING_STAGE:
            if time_budget_s is not None:
                limit = time_budget_s + self.stage_s
                return limit, (
                    f"tuning ran {self.stage_s:g} s past the job's time budget of {time_budget_s:g} s "
                    "(KILN_JOB_STAGE_TIMEOUT_S) and was stopped"
                )
            return self.tuning_s, (
                f"tuning took longer than {self.tuning_s:g} s (KILN_JOB_TUNING_TIMEOUT_S; give the job a "
                "time budget or fewer trials)"
            )
        during = f" {stage}" if stage else ""
        return (
            self.stage_s,
            f"the job spent longer than {self.stage_s:g} s{during} (KILN_JOB_STAGE_TIMEOUT_S)",
        )

    def memory_reason(self, stage: str | None) -> str:
        """Why a job whose processes outgrew :attr:`memory_mb` was stopped."""
        during = f" while {stage}" if stage else ""
        return (
            f"the job's processes needed more than {self.memory_mb} MiB of memory together{during} "
            "(KILN_JOB_MEMORY_MB) and were stopped; the worker is unaffected"
        )


def process_memory_bytes(process: psutil.Process) -> int:
    """One process's proportional set size (its resident size where the kernel cannot tell; 0 once gone)."""
    with contextlib.suppress(OSError), open(f"/proc/{process.pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) << 10
    with contextlib.suppress(psutil.Error):
        return int(process.memory_info().rss)
    return 0


def tree_memory_bytes(root_pid: int) -> int:
    """The memory of a process and all its descendants (see :func:`process_memory_bytes`); 0 once gone."""
    try:
        root = psutil.Process(root_pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    return sum(process_memory_bytes(p) for p in processes)


@dataclass
class JobWatch:
    """A running job's limits, checked by its supervisor: :meth:`check` says why to stop it, or None."""

    limits: JobLimits
    root_pid: int
    time_budget_s: float | None
    peak_bytes: int = 0
    _stage_key: str | None = field(default=None, init=False)
    _stage_since: float = field(default_factory=time.monotonic, init=False)

    def check(self, stage: str | None) -> str | None:
        """The reason the job (now at ``stage``) must stop, or None while it is within its limits."""
        key = "planning" if stage in PLANNING_STAGES else stage
        now = time.monotonic()
        if key != self._stage_key:
            self._stage_key, self._stage_since = key, now
        used = tree_memory_bytes(self.root_pid)
        self.peak_bytes = max(self.peak_bytes, used)
        if used > self.limits.memory_mb << 20:
            return self.limits.memory_reason(stage)
        limit_s, reason = self.limits.stage_limit(stage, self.time_budget_s)
        if now - self._stage_since > limit_s:
            return reason
        return None


__all__ = [
    "JobLimits",
    "JobWatch",
    "PLANNING_STAGES",
    "process_memory_bytes",
    "tree_memory_bytes",
]
