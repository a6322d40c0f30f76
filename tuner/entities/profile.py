"""A compiled model's profile: this machine's limits, each kernel's time and assembly."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class KernelAssembly:
    """A task's kernel as the CPU runs it: its assembly in the job's compiled model and what it uses
    (:func:`tuner.views.assembly.instruction_mix`)."""

    task_id: int
    name: str
    text: str
    mix: dict[str, Any]


#: The figures :func:`tuner.timing.roofline.measure_limits` takes now (see :attr:`MachineLimits.version`):
#: limits kept with an older version are measured again.
LIMITS_VERSION = 2


@dataclass(frozen=True)
class MachineLimits:
    """The measured roofs of one machine for one target (:func:`tuner.timing.roofline.measure_limits`)."""

    #: fp32 FMA peak of all threads together, GFLOP/s.
    peak_gflops: float
    #: the same with one thread (what one core reaches alone: a boosting CPU runs it faster).
    peak_gflops_one_thread: float
    #: STREAM triad bandwidth of all threads, GB/s (10^9 bytes).
    bandwidth_gbs: float
    threads: int
    vector_lanes: int
    #: how each figure was measured, in words.
    how: str
    #: the largest share of all CPUs other processes used while a figure kept here was measured (None where
    #: it could not be read); ``disturbed`` when that was over the busy threshold even after retries.
    other_cpu_share: float | None = None
    disturbed: bool = False
    #: how many measurements these figures are the best of (a disturbed one is measured again, a few times).
    measurements: int = 1
    #: the machine and target these are of ("" until stored), and when they were measured.
    host: str = ""
    measured_at: datetime | None = None
    #: the int8 peak of all threads (G operations/s, a multiply-accumulate counting 2) on the CPU's widest
    #: int8 dot product, and that instruction; None where the CPU has none.
    int8_gops: float | None = None
    int8_instruction: str | None = None
    #: the bf16 peak of all threads (GFLOP/s) on AVX512-BF16's ``vdpbf16ps``; None without it (bf16 is
    #: then computed in fp32, under the fp32 peak).
    bf16_gflops: float | None = None
    bf16_instruction: str | None = None
    #: which figures were measured: 1, fp32 and bandwidth only (limits kept by an older Kiln); 2, the
    #: int8 and bf16 peaks too (:data:`LIMITS_VERSION`).
    version: int = 1

    def peak_for(self, precision: str | None) -> float:
        """The compute roof of a kernel computing in ``precision`` ("int8", "bf16", else fp32): its own
        peak where the CPU has a dot product for it, the fp32 peak otherwise."""
        own = {"int8": self.int8_gops, "bf16": self.bf16_gflops}.get(precision or "")
        return own if own else self.peak_gflops

    def as_dict(self) -> dict[str, Any]:
        """The limits as plain JSON."""
        out = asdict(self)
        out["measured_at"] = self.measured_at.isoformat() if self.measured_at else None
        return out

    def best_of(self, again: MachineLimits) -> MachineLimits:
        """These limits and ``again`` (a later measurement of the same machine) as one: each figure the
        higher of the two, since another process only ever lowers one; disturbed only if both were."""
        quiet = again if not again.disturbed else self
        return replace(
            quiet,
            peak_gflops=max(self.peak_gflops, again.peak_gflops),
            peak_gflops_one_thread=max(self.peak_gflops_one_thread, again.peak_gflops_one_thread),
            bandwidth_gbs=max(self.bandwidth_gbs, again.bandwidth_gbs),
            int8_gops=_higher(self.int8_gops, again.int8_gops),
            bf16_gflops=_higher(self.bf16_gflops, again.bf16_gflops),
            measurements=self.measurements + again.measurements,
        )

    @property
    def ridge_intensity(self) -> float:
        """FLOP per byte where the bandwidth roof meets the fp32 compute roof."""
        return self.ridge_intensity_for(None)

    def ridge_intensity_for(self, precision: str | None) -> float:
        """Operations per byte where the bandwidth roof meets ``precision``'s compute roof."""
        return self.peak_for(precision) / self.bandwidth_gbs if self.bandwidth_gbs > 0 else float("inf")

    def attainable_gflops(self, intensity: float, precision: str | None = None) -> float:
        """The roofline at ``intensity`` operations/byte: the lower of ``precision``'s peak (fp32's by
        default) and bandwidth x intensity."""
        return min(self.peak_for(precision), self.bandwidth_gbs * intensity)


def _higher(first: float | None, second: float | None) -> float | None:
    return max((x for x in (first, second) if x is not None), default=None)


@dataclass(frozen=True)
class KernelProfile:
    """One kernel (or the VM's own work) of a profiled model: its calls, time, arithmetic and traffic.

    ``flops`` and ``bytes`` are per call: FLOPs from the kernel's TIR, bytes as the sum of its argument
    tensors (every input read once, every output written once: the traffic a kernel cannot avoid).
    """

    name: str
    kind: str  # "kernel" (a TIR function) or "runtime" (the VM's builtins: allocation, reshapes, checks)
    calls: int
    total_us: float  # over all calls in one run of the model (per call: the median over the runs)
    share: float  # of the profile's total
    flops: float | None = None
    bytes: int | None = None
    #: onnxruntime's nodes matched to this kernel's calls, their time in one run, and how many of the
    #: kernel's calls some node matched (a kernel compares with onnxruntime only when all did).
    onnxruntime_us: float | None = None
    onnxruntime_nodes: tuple[str, ...] = ()
    matched_calls: int = 0
    #: what the kernel computes in ("fp32", "int8", "bf16"; None: other or unknown): its roof is that
    #: precision's peak (:meth:`MachineLimits.peak_for`).
    precision: str | None = None

    @property
    def gflops(self) -> float | None:
        """Achieved GFLOP/s."""
        if not self.flops or self.total_us <= 0:
            return None
        return self.flops * self.calls / (self.total_us * 1e3)

    @property
    def intensity(self) -> float | None:
        """Arithmetic intensity, FLOP per byte moved."""
        return self.flops / self.bytes if self.flops and self.bytes else None

    @property
    def gbs(self) -> float | None:
        """Bytes moved per second, GB/s."""
        if not self.bytes or self.total_us <= 0:
            return None
        return self.bytes * self.calls / (self.total_us * 1e3)

    @property
    def compared(self) -> bool:
        """Whether onnxruntime's time covers every call of this kernel."""
        return self.onnxruntime_us is not None and self.matched_calls == self.calls

    def attainable_gflops(self, limits: MachineLimits | None) -> float | None:
        """The roofline's GFLOP/s at this kernel's intensity (None: no limits or no intensity)."""
        intensity = self.intensity
        return limits.attainable_gflops(intensity, self.precision) if limits and intensity else None

    def bound(self, limits: MachineLimits | None) -> str | None:
        """``"memory"`` left of the ridge point, ``"compute"`` right of it (None: unknown)."""
        intensity = self.intensity
        if not limits or not intensity:
            return None
        return "memory" if intensity < limits.ridge_intensity_for(self.precision) else "compute"


@dataclass(frozen=True)
class OnnxruntimeNode:
    """One node of onnxruntime's own profile of the model (one run: median over the runs)."""

    name: str
    op: str
    us: float
    kernel: str | None = None  # the Kiln kernel it was matched to (None: none)


@dataclass(frozen=True)
class ModelProfile:
    """Where a compiled model's time goes, kernel by kernel, against the machine's roofline."""

    kernels: tuple[KernelProfile, ...]
    runs: int  # profiled runs the medians are over
    total_us: float  # the kernels' time in one run plus the VM's own (the run less its kernels)
    latency_ms: float | None = None  # the model's latency as the job measured it (uninstrumented)
    #: the model's run, uninstrumented, in the process that profiled it (median; what the total explains)
    run_us: float | None = None
    limits: MachineLimits | None = None
    onnxruntime_nodes: tuple[OnnxruntimeNode, ...] = ()
    onnxruntime_total_us: float | None = None  # onnxruntime's run, as its profiler timed it
    #: onnxruntime's latency as the job measured it, unprofiled (its profiler adds its own cost per node)
    onnxruntime_latency_ms: float | None = None
    #: why there is no onnxruntime profile ("" when there is one).
    onnxruntime_note: str = ""
    how: str = ""

    @property
    def kernels_us(self) -> float:
        """The kernels' time in one run (the profile's total less the VM's own)."""
        return sum(k.total_us for k in self.kernels if k.kind == "kernel")

    @property
    def onnxruntime_unmatched_us(self) -> float:
        """onnxruntime's time in nodes no Kiln kernel matched."""
        return sum(n.us for n in self.onnxruntime_nodes if n.kernel is None)

    def as_dict(self) -> dict[str, Any]:
        """The profile as plain JSON (what the store keeps)."""
        out = asdict(self)
        out["limits"] = self.limits.as_dict() if self.limits else None
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelProfile:
        """The inverse of :meth:`as_dict`."""
        limits = data.get("limits")
        if limits:
            at = limits.get("measured_at")
            limits = MachineLimits(**{**limits, "measured_at": datetime.fromisoformat(at) if at else None})
        return cls(
            kernels=tuple(
                KernelProfile(**{**k, "onnxruntime_nodes": tuple(k.get("onnxruntime_nodes", ()))})
                for k in data["kernels"]
            ),
            runs=data["runs"],
            total_us=data["total_us"],
            latency_ms=data.get("latency_ms"),
            run_us=data.get("run_us"),
            limits=limits or None,
            onnxruntime_nodes=tuple(OnnxruntimeNode(**n) for n in data.get("onnxruntime_nodes", ())),
            onnxruntime_total_us=data.get("onnxruntime_total_us"),
            onnxruntime_latency_ms=data.get("onnxruntime_latency_ms"),
            onnxruntime_note=data.get("onnxruntime_note", ""),
            how=data.get("how", ""),
        )
