"""Plain entities of Kiln's core. The store converts its rows into these; nothing else sees ORM rows."""

from __future__ import annotations

import enum
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from tuner.errors import InvalidSpec

Dim = int | str  # a concrete size, or the name of a dynamic dimension

DEFAULT_TRIALS = 64  # a job's trial budget when it gives neither trials nor a time budget


def trial_budget(trials: int | None, time_budget_s: float | None) -> int | None:
    """The trials of a job asked for with ``trials`` and ``time_budget_s``: as given; DEFAULT_TRIALS when
    neither is given; no limit (None) with a time budget alone."""
    return DEFAULT_TRIALS if trials is None and time_budget_s is None else trials


class ModelFormat(str, enum.Enum):
    """File formats Kiln imports."""

    ONNX = "onnx"
    TORCH_EXPORT = "torch-export"
    JAX_EXPORT = "jax-export"  # a serialized jax.export.Exported (.jax)
    STABLEHLO = "stablehlo"  # StableHLO MLIR, text or bytecode (.mlir)


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


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one model input or output."""

    name: str
    shape: tuple[Dim, ...]
    dtype: str

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(name=data["name"], shape=tuple(data["shape"]), dtype=data["dtype"])


@dataclass(frozen=True)
class BoundInput:
    """An input fixed to a value when the model was registered (``input_values``): a constant of the
    stored model, no longer an input of it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    values: Any  # a number, or nested lists (JSON)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "values": self.values}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BoundInput:
        return cls(data["name"], data["dtype"], tuple(data["shape"]), data["values"])


@dataclass(frozen=True)
class ModelSignature:
    """Inputs and outputs of a model, in call order."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # The inputs as the model itself declares them (dynamic dimensions by name), when they differ from
    # ``inputs`` (concrete shapes given at upload): what a job's input shapes are checked against.
    declared_inputs: tuple[TensorSpec, ...] | None = field(default=None, compare=False)
    # Inputs of the model as uploaded that were bound to values at registration (no longer inputs).
    bound_inputs: tuple[BoundInput, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }
        if self.declared_inputs is not None and self.declared_inputs != self.inputs:
            data["declared_inputs"] = [t.to_dict() for t in self.declared_inputs]
        if self.bound_inputs:
            data["bound_inputs"] = [b.to_dict() for b in self.bound_inputs]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSignature:
        declared = data.get("declared_inputs")
        return cls(
            inputs=tuple(TensorSpec.from_dict(t) for t in data["inputs"]),
            outputs=tuple(TensorSpec.from_dict(t) for t in data["outputs"]),
            declared_inputs=tuple(TensorSpec.from_dict(t) for t in declared) if declared else None,
            bound_inputs=tuple(BoundInput.from_dict(b) for b in data.get("bound_inputs") or ()),
        )

    @property
    def model_inputs(self) -> tuple[TensorSpec, ...]:
        """The inputs as the model declares them."""
        return self.declared_inputs or self.inputs


@dataclass(frozen=True)
class ModelInfo:
    """A stored model: its bytes live in the blob directory under ``sha256``."""

    id: str
    name: str
    format: ModelFormat
    sha256: str
    size_bytes: int
    signature: ModelSignature
    created_at: datetime
    owner: str = ""  # the API token name that uploaded it ("" when the service runs without auth)


@dataclass(frozen=True)
class TaskInfo:
    """A tuning task extracted from a model (before any tuning)."""

    name: str
    weight: int
    flops: float
    workload_hash: str
    tir: str  # TVMScript of the fused PrimFunc before scheduling
    #: The polyhedral analysis of that PrimFunc (schedules.poly, without cache sizes), as JSON; an
    #: ``{"error": ...}`` when it failed.
    polyhedral: dict[str, Any] | None = None


@dataclass(frozen=True)
class IrLevel:
    """One level of a model's lowering: the Relax program after one of Kiln's graph passes (or as
    imported, or fused), and what that pass changed."""

    position: int  # 0: as imported; then one per pass, in the order they ran
    name: str  # "imported", "ConvertLayout", "FoldConstant", "FuseOps", ...
    text: str  # the program's Relax functions as TVMScript ("" when unchanged: see ``changed``)
    changed: bool  # False: the pass left the program as the level before (its text is that level's)
    operators_before: int
    operators_after: int
    #: Relax operator calls by kind after the pass, and their change by kind (after - before; nonzero only).
    histogram: dict[str, int] = field(default_factory=dict)
    delta: dict[str, int] = field(default_factory=dict)
    kernels: int = 0  # calls of TIR kernels (call_tir) after the pass
    prim_funcs: int = 0  # TIR functions in the module after the pass
    seconds: float = 0.0  # how long the pass ran


@dataclass(frozen=True)
class KernelAssembly:
    """A task's kernel as the CPU runs it: its assembly in the job's compiled model and what it uses
    (:func:`tuner.assembly.instruction_mix`)."""

    task_id: int
    name: str
    text: str
    mix: dict[str, Any]


@dataclass(frozen=True)
class MachineLimits:
    """The measured roofs of one machine for one target (:func:`tuner.roofline.measure_limits`)."""

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
    #: the machine and target these are of ("" until stored), and when they were measured.
    host: str = ""
    measured_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        """The limits as plain JSON."""
        out = asdict(self)
        out["measured_at"] = self.measured_at.isoformat() if self.measured_at else None
        return out

    @property
    def ridge_intensity(self) -> float:
        """FLOP per byte where the bandwidth roof meets the compute roof."""
        return self.peak_gflops / self.bandwidth_gbs if self.bandwidth_gbs > 0 else float("inf")

    def attainable_gflops(self, intensity: float) -> float:
        """The roofline at ``intensity`` FLOP/byte: the lower of the peak and bandwidth x intensity."""
        return min(self.peak_gflops, self.bandwidth_gbs * intensity)


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
        return limits.attainable_gflops(intensity) if limits and intensity else None

    def bound(self, limits: MachineLimits | None) -> str | None:
        """``"memory"`` left of the ridge point, ``"compute"`` right of it (None: unknown)."""
        intensity = self.intensity
        if not limits or not intensity:
            return None
        return "memory" if intensity < limits.ridge_intensity else "compute"


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


@dataclass(frozen=True)
class KeptFloat:
    """A quantized operator of the model that Kiln left in float, and why."""

    op: str  # "conv2d", "matmul"
    shapes: str  # "1x256 @ 256x512"
    reason: str


@dataclass(frozen=True)
class FusionSummary:
    """Graph-level effect of Kiln's passes: operators before fusion, kernels after, and for quantized models
    the operators computed in integers and those kept in float."""

    operators_before: int
    kernels_after: int
    distinct_tasks: int
    operator_histogram: dict[str, int] = field(default_factory=dict)
    integer_ops: list[str] = field(default_factory=list)  # "conv2d 1x3x32x32 * 16x3x3x3 -> int8"
    kept_float: list[KeptFloat] = field(default_factory=list)
    #: How the integer kernels compute: "amx" (weights packed for vpdpbusd where they fit, and the packed
    #: matmuls that are whole 16 x 32 x 64 blocks on AMX tiles), "vnni" (packed for vpdpbusd zmm where they
    #: fit), "avx-vnni" (packed 8 channels wide for vpdpbusd ymm: AVX-VNNI without AVX-512), "plain"
    #: (tiled integer loops: the CPU has no VNNI); "" without integer kernels.
    integer_kernels: str = ""
    vnni_packed: list[str] = field(default_factory=list)  # "conv2d 1x56x56x64 * 64x3x3x64"
    amx_matmuls: list[str] = field(default_factory=list)  # of vnni_packed, those tuned on AMX tiles
    vnni_unpacked: list[str] = field(default_factory=list)  # "conv2d 1x224x224x3 * ...: why"
    #: The job's precision policy (tuner.precision), the operators it put on low-precision operands, and
    #: how the target computes them: "native", "mixed", "emulated" (with why in the note), or "" when none
    #: was; the bf16 matmuls on AMX-BF16 kernels among them, those (and the convolutions) on AVX512-BF16's,
    #: and on a CPU with either, the bf16 operators on neither (why).
    precision: str = "as-is"
    reduced_ops: list[str] = field(default_factory=list)  # "matmul 32x512 @ 512x2048 -> bf16"
    amx_bf16_matmuls: list[str] = field(default_factory=list)  # "matmul 128x256 @ 256x1024"
    avx512_bf16_matmuls: list[str] = field(default_factory=list)  # on vdpbf16ps: "matmul 4x256 @ 256x512"
    avx512_bf16_convolutions: list[str] = field(default_factory=list)  # "conv2d 1x56x56x64 * 64x3x3x64"
    bf16_unpacked: list[str] = field(default_factory=list)  # bf16 operators on no bf16 instruction: why
    precision_compute: str = ""
    precision_note: str = ""
    #: The graph passes that failed on this model and were left out, or operators a pass kept out of its
    #: rewrite, each with TVM's reason (``tuner.pass_guard``): the plan compiles without them.
    skipped_passes: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FusionSummary:
        """The summary from its JSON form (``dataclasses.asdict``)."""
        fields = dict(data)
        fields["kept_float"] = [KeptFloat(**k) for k in fields.get("kept_float", [])]
        return cls(**fields)


@dataclass(frozen=True)
class ModelPlan:
    """A model's tuning tasks and fused graph on one target, before any tuning."""

    target_key: str
    tasks: list[TaskInfo]
    fusion: FusionSummary
    graph: str  # the Relax program after fusion, as TVMScript


@dataclass(frozen=True)
class PlanError:
    """Why a model could not be planned for a target (kept, so that it is not retried per request)."""

    target_key: str
    kind: str  # a KilnError kind
    message: str
    transient: bool = False  # it may not come again (the machine was busy, the client left): not kept


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
    #: The precision policy for float matmuls and convolutions (tuner.precision): as-is, bf16 or fp16.
    precision: str = "as-is"
    #: A stored float model this (quantized or reduced-precision) one stands for: the accuracy report
    #: adds the top-1 agreement of the tuned build with it.
    float_model_id: str | None = None

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
        )


@dataclass(frozen=True)
class Timing:
    """One implementation's end-to-end latency over interleaved rounds, each round in a fresh process."""

    rounds_ms: tuple[float, ...]  # each round's median call time, in the order the rounds ran

    @property
    def median_ms(self) -> float:
        return statistics.median(self.rounds_ms)

    @property
    def min_ms(self) -> float:
        return min(self.rounds_ms)

    @property
    def max_ms(self) -> float:
        return max(self.rounds_ms)

    @property
    def spread(self) -> float:
        """(max - min) / median of the rounds: 0 when they agree."""
        return (self.max_ms - self.min_ms) / self.median_ms if self.median_ms > 0 else 0.0


@dataclass(frozen=True)
class LatencyReport:
    """How a job's side-by-side latencies were measured: every implementation's rounds, how much of the
    machine other processes used meanwhile, and the warnings a reader of the figures needs."""

    timings: dict[str, Timing]  # by implementation: "untuned TVM", "Kiln", "onnxruntime", ...
    warnings: tuple[str, ...] = ()
    other_cpu_share: float | None = None  # fraction of all CPUs other processes used while timing
    load_average: float | None = None  # 1-minute load average when timing began

    def to_dict(self) -> dict[str, Any]:
        return {
            "timings": {name: list(t.rounds_ms) for name, t in self.timings.items()},
            "warnings": list(self.warnings),
            "other_cpu_share": self.other_cpu_share,
            "load_average": self.load_average,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyReport:
        return cls(
            timings={
                name: Timing(tuple(float(x) for x in rounds)) for name, rounds in data["timings"].items()
            },
            warnings=tuple(data.get("warnings") or ()),
            other_cpu_share=data.get("other_cpu_share"),
            load_average=data.get("load_average"),
        )


@dataclass(frozen=True)
class OutputAccuracy:
    """How one output of a quantized or reduced-precision job's tuned build compares with the reference
    over seeded inputs."""

    name: str
    step: float | None  # one quantization step of the output (its DequantizeLinear scale); None: float
    max_abs: float
    max_steps: float | None  # max_abs in steps (LSB)
    beyond_one_step: float | None  # share of the elements more than one step off
    cosine: float  # cosine similarity of all the elements, flattened
    relative_error: float | None = None  # ||actual - reference|| / ||reference||, all elements flattened
    #: Share of the rows (last axis) whose arg-max equals the float model's (None: no float model given).
    top1_agreement: float | None = None


@dataclass(frozen=True)
class AccuracyReport:
    """A quantized or reduced-precision job's outputs against a reference (onnxruntime on the same model,
    or untuned TVM in float32) over seeded inputs; ``tolerance``: the norm-wise relative error a
    reduced-precision job is held to (None: quantized, held to one step)."""

    reference: str
    inputs: int
    outputs: tuple[OutputAccuracy, ...]
    tolerance: float | None = None
    float_model: str | None = None  # the float model top-1 agreement was counted against (its name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "inputs": self.inputs,
            "outputs": [asdict(o) for o in self.outputs],
            "tolerance": self.tolerance,
            "float_model": self.float_model,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AccuracyReport:
        return cls(
            data["reference"],
            int(data["inputs"]),
            tuple(OutputAccuracy(**o) for o in data["outputs"]),
            data.get("tolerance"),
            data.get("float_model"),
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
        if self.best_latency_us and self.flops:
            return self.flops / (self.best_latency_us * 1e-6) / 1e9
        return None


@dataclass(frozen=True)
class Record:
    """One measured candidate schedule."""

    id: int
    workload_id: int
    job_id: str | None
    target_key: str
    run_secs: tuple[float, ...]
    mean_latency_us: float | None  # None when the candidate failed to build or run
    trace: Any  # MetaSchedule trace JSON
    created_at: datetime
    error: str | None = None


# Rows the store returns in bulk (records, timelines) are named tuples: entities by name, cheap by the
# thousand, and still unpacked like the tuples they replace.


class StoredWorkload(NamedTuple):
    """A stored workload (a task's TIR) as MetaSchedule JSON."""

    id: int
    workload_json: str


class StoredRecord(NamedTuple):
    """A tuning record with its workload, both as MetaSchedule JSON (what a JSON database holds)."""

    workload_id: int
    workload_json: str
    record_json: str


@dataclass(frozen=True)
class StoredCostModel:
    """A cost model kept in the store: trained on ``samples`` measured schedules of ``target_key`` (of the
    ``scope`` owner's jobs; "" the shared pool), the newest of them record ``last_record_id``."""

    target_key: str
    scope: str
    samples: int
    last_record_id: int
    model_tar: bytes
    trained_at: datetime | None = None


class NewRecord(NamedTuple):
    """A valid tuning record stored after some other, with its workload (MetaSchedule JSON)."""

    id: int
    job_id: str | None
    workload_id: int
    workload_json: str
    record_json: str


class BestRecord(NamedTuple):
    """A workload's fastest valid record."""

    workload_json: str
    record_json: str
    mean_run_sec: float


class TimelineEntry(NamedTuple):
    """One record of a job, in commit order: its latency (None when the candidate failed)."""

    record_id: int
    workload_id: int
    latency_us: float | None
    at: datetime


class ApiToken(NamedTuple):
    """A stored API token, by name (only the token's hash is kept)."""

    name: str
    created_at: datetime


@dataclass(frozen=True)
class Artifact:
    """A compiled, verified model package of a job."""

    id: int
    job_id: str
    path: str
    sha256: str
    size_bytes: int
    created_at: datetime
