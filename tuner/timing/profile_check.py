"""Whether a profile's figures agree with each other and with the job's, and by how much they do not.

A profile times each kernel in place, then the model's run, then the kernels again (the lower of the two
passes kept). On a machine other processes are using, a kernel can be timed while it shares the cores:
the kernels then add up to more than the run they belong to, a kernel takes several times its own tuned
best, and every per-kernel comparison with onnxruntime leans against Kiln. Such a profile is still shown
(it is what was measured), with what disagrees said in numbers, so that nobody reads it as the model's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tuner.entities import Job, ModelProfile, Task

if TYPE_CHECKING:
    from tuner.store.sql import Store

#: The kernels may add up to a little more than the run (each timed alone, with its inputs in cache, and
#: the run's own median varies): beyond this share of it, they were disturbed.
KERNELS_OVER_RUN = 1.10
#: The run timed while profiling against the job's own latency measurement.
RUN_OVER_LATENCY = 1.25
#: A kernel's time per call against the best its task measured while tuning.
KERNEL_OVER_BEST = 1.5


@dataclass(frozen=True)
class ProfileCheck:
    """What disagrees in a profile (empty: its figures agree), and each kernel's tuned best per call."""

    warnings: list[str] = field(default_factory=list)
    tuned_best_us: dict[str, float] = field(default_factory=dict)
    #: kernel name -> its time per call over its tuned best, for the kernels beyond KERNEL_OVER_BEST
    slow_kernels: dict[str, float] = field(default_factory=dict)

    @property
    def disturbed(self) -> bool:
        """Whether the figures were disturbed (and the card says so)."""
        return bool(self.warnings)


def check_profile(profile: ModelProfile, tuned_best_us: Mapping[str, float]) -> ProfileCheck:
    """Compare ``profile``'s figures with each other and with the job's: its kernels' sum against the run
    timed beside them, that run against the job's latency, each kernel against its task's tuned best
    (``tuned_best_us``: kernel name -> µs per call)."""
    warnings: list[str] = []
    kernels_us = profile.kernels_us
    run_us = profile.run_us
    if run_us and kernels_us > KERNELS_OVER_RUN * run_us:
        warnings.append(
            f"The kernels, each timed in place, add up to {kernels_us:.1f} µs: {100 * kernels_us / run_us:.0f} % "
            f"of the {run_us:.1f} µs run timed beside them. Other work shared the cores while they were timed, "
            f"so their times are inflated, by up to {kernels_us / run_us:.1f}×."
        )
    latency_us = profile.latency_ms * 1e3 if profile.latency_ms else None
    if run_us and latency_us and run_us > RUN_OVER_LATENCY * latency_us:
        warnings.append(
            f"The run timed while profiling took {run_us:.1f} µs, {run_us / latency_us:.1f}× the "
            f"{latency_us:.1f} µs the job measured: the machine was slower (busier) while profiling."
        )
    elif run_us and latency_us and latency_us > RUN_OVER_LATENCY * run_us:
        warnings.append(
            f"The job measured {latency_us:.1f} µs, {latency_us / run_us:.1f}× the {run_us:.1f} µs run timed "
            "while profiling: the job's own measurement was slower (see its rounds), so the profile's times "
            "add up to less than the job's latency."
        )
    bests = {name: us for name, us in tuned_best_us.items() if us > 0}
    slow: dict[str, float] = {}
    for kernel in profile.kernels:
        best = bests.get(kernel.name)
        if kernel.kind != "kernel" or best is None or kernel.calls <= 0:
            continue
        over = kernel.total_us / kernel.calls / best
        if over > KERNEL_OVER_BEST:
            slow[kernel.name] = over
    if slow:
        name = max(slow, key=slow.__getitem__)
        worst = next(k for k in profile.kernels if k.name == name)
        warnings.append(
            f"{len(slow)} of the kernels took more than {KERNEL_OVER_BEST:g}× their tuned best per call (the "
            f"most: {name}, {worst.total_us / worst.calls:.1f} µs against {bests[name]:.1f} µs, "
            f"{slow[name]:.1f}×); comparisons with onnxruntime kernel by kernel lean against Kiln by as much."
        )
    return ProfileCheck(warnings, {k.name: bests[k.name] for k in profile.kernels if k.name in bests}, slow)


def job_profile(store: Store, job: Job) -> tuple[ModelProfile, ProfileCheck]:
    """A job's profile, and whether its figures agree with each other and with each kernel's tuned best."""
    profile = store.get_job_profile(job.id)
    return profile, check_profile(profile, kernel_bests(profile, store.list_tasks(job.id)))


def kernel_bests(profile: ModelProfile, tasks: list[Task]) -> dict[str, float]:
    """Each profiled kernel's tuned best per call (µs), from its task: the kernel of a task, or the per-inference
    half (``_prepacked``) of one whose weights are laid out at load time."""
    bests = {t.name: t.best_latency_us for t in tasks if t.best_latency_us}
    found = {}
    for kernel in profile.kernels:
        name = kernel.name.removesuffix("_prepacked")
        if name in bests:
            found[kernel.name] = bests[name]
    return found
