"""A captured graph compiled by Kiln: built with the tuned records of Kiln's store (and schedules built
without measuring for the kernels that have none), called with torch tensors, rebuilt when a tuning job
queued for it finishes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kiln_tvm import dlight, relax, tvm
from schedules.poly.caches import host_caches
from tuner.capture.graph import ExportedCapture
from tuner.capture.options import CaptureOptions
from tuner.compile import LoadedModel, build_tuned
from tuner.entities import JobStatus
from tuner.frontend.torch import convert_program, decompose_program
from tuner.metaschedule.database import KilnDatabase
from tuner.passes.plan import GraphPlan, plan_graph
from tuner.schedule_choice import KernelChoice, ScheduleSource, choose_schedules
from tuner.store.sql import Store
from tuner.targets import canonical_target_key, is_host_cpu, resolve_target, to_tvm_target

log = logging.getLogger("kiln.capture")


@dataclass
class CaptureReport:
    """What Kiln did with one captured graph (``tuner.capture.compiled_graphs()`` lists them)."""

    name: str
    target_key: str
    inputs: list[tuple[int | str, ...]]
    frozen: bool
    dynamic: bool
    kernels: list[KernelChoice] = field(default_factory=list)
    job_id: str | None = None  # the tuning job queued or run for the graph
    notes: list[str] = field(default_factory=list)

    @property
    def tuned(self) -> int:
        return sum(1 for k in self.kernels if k.source is ScheduleSource.TUNED)

    @property
    def untuned(self) -> list[KernelChoice]:
        return [k for k in self.kernels if k.source is not ScheduleSource.TUNED]

    def summary(self) -> str:
        """One line for the log."""
        if self.dynamic:
            return f"{self.name}: compiled with symbolic shapes, untuned ({len(self.kernels)} kernels)"
        by_source: dict[str, int] = {}
        for k in self.kernels:
            by_source[k.source.value] = by_source.get(k.source.value, 0) + 1
        parts = ", ".join(f"{n} {s}" for s, n in sorted(by_source.items()))
        return f"{self.name}: {len(self.kernels)} kernels on {self.target_key} ({parts or 'none'})"


class CompiledGraph:
    """The callable Dynamo runs in place of the captured graph."""

    def __init__(
        self,
        exported: ExportedCapture,
        options: CaptureOptions,
        store_factory: Callable[[], Store],
        name: str,
        eager: Callable[..., Any],
    ) -> None:
        import torch

        self._torch = torch
        self._eager = eager
        self._failed = False
        self.exported = exported
        self.options = options
        self._store_factory = store_factory
        self.target = resolve_target(options.target)
        if not is_host_cpu(self.target):
            raise ValueError(f"target {self.target} does not run on this machine's CPU")
        self.tvm_target = to_tvm_target(self.target)
        self.target_key = canonical_target_key(self.target)
        self.mod = convert_program(decompose_program(exported.program, name), name)
        self.out_spec = exported.program.call_spec.out_spec
        self.report = CaptureReport(
            name=name,
            target_key=self.target_key,
            inputs=_input_shapes(exported.program),
            frozen=exported.frozen,
            dynamic=exported.dynamic,
        )
        self.plan: GraphPlan | None = None
        self._next_poll = 0.0
        self._pending_job: str | None = None
        self._runner = self._loaded(self._build())
        self._flat_tuple = self.out_spec.type is tuple and all(c.is_leaf() for c in self.out_spec.children())

    # ---- building ------------------------------------------------------------------------------------

    def _build(self) -> LoadedModel:
        if self.exported.dynamic:
            return LoadedModel(_build_symbolic(self.mod, self.tvm_target, self.report))
        settings = self.options.settings
        if self.plan is None:
            self.plan = plan_graph(
                self.mod,
                self.tvm_target,
                settings.planning_options(),
            )
        store = self._store_factory()
        database = KilnDatabase(store, self.target_key, owner=settings.record_scope(self.options.owner))
        memory, choices = choose_schedules(
            self.plan.tasks, self.tvm_target, database, host_caches(settings.cache_sizes)
        )
        self.report.kernels = choices
        return LoadedModel(build_tuned(self.plan, self.tvm_target, memory))

    @staticmethod
    def _loaded(model: LoadedModel) -> tuple[Any, list[Any]]:
        # ``main`` looked up once: a lookup per call costs about a microsecond.
        return model.vm["main"], model.params

    def rebuild(self) -> None:
        """Build again with the records Kiln's store holds now."""
        self._runner = self._loaded(self._build())  # one assignment: a call sees the old or the new build

    def wait_for_job(self, job_id: str) -> None:
        """Look at the queued job ``job_id`` every ``capture_poll_s`` seconds (on calls) and rebuild once it
        has succeeded."""
        self.report.job_id = self._pending_job = job_id
        self._next_poll = time.monotonic() + self.options.settings.capture_poll_s

    def _poll_job(self) -> None:
        job_id = self._pending_job
        if job_id is None or time.monotonic() < self._next_poll:
            return
        self._next_poll = time.monotonic() + self.options.settings.capture_poll_s
        try:
            status = self._store_factory().get_job(job_id).status
        except Exception as exc:  # noqa: BLE001 - a store that is away now is asked again later
            log.debug("kiln: could not read job %s: %s", job_id, exc)
            return
        if status is JobStatus.SUCCEEDED:
            self._pending_job = None
            before = self.report.tuned
            self.rebuild()
            log.warning(
                "kiln: %s: tuning job %s finished; rebuilt with %d tuned kernels (%d before)",
                self.report.name,
                job_id,
                self.report.tuned,
                before,
            )
        elif status in (JobStatus.FAILED, JobStatus.CANCELLED):
            self._pending_job = None
            self.report.notes.append(f"tuning job {job_id} ended {status.value}")
            log.warning("kiln: %s: tuning job %s ended %s", self.report.name, job_id, status.value)

    # ---- running -------------------------------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        if self._failed:
            return self._eager(*args)
        if self._pending_job is not None:
            self._poll_job()
        main, params = self._runner
        try:
            outputs = main(*[_plain_tensor(args[i]) for i in self.exported.fed], *params)
        except Exception as exc:  # noqa: BLE001 - the user's program goes on, eagerly, with the reason
            self._failed = True
            self.report.notes.append(f"a call failed and the graph now runs eagerly: {exc}")
            log.warning(
                "kiln: %s: a call failed; the graph runs eagerly from now on: %s", self.report.name, exc
            )
            return self._eager(*args)
        flat = [_to_torch(self._torch, t) for t in _flatten(outputs)]
        if self._flat_tuple:
            return tuple(flat)
        return self._torch.utils._pytree.tree_unflatten(flat, self.out_spec)


#: The alignment TVM's kernels assume of every buffer (its allocator's; vectorised loads rely on it).
TVM_ALIGNMENT = 64


def _plain_tensor(t: Any) -> Any:
    """What DLPack hands to TVM without a copy where it can: no autograd (DLPack refuses tensors that
    require grad), dense strides, and data aligned as TVM's kernels assume. A view into a tensor, or a
    numpy array's memory (16-byte aligned), is copied: read in place it crashed the kernels."""
    if t.requires_grad:
        t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.data_ptr() % TVM_ALIGNMENT:
        t = t.clone()  # PyTorch's CPU allocator aligns to 64 bytes
    return t


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list | tuple) or (hasattr(value, "__len__") and not hasattr(value, "shape")):
        flat: list[Any] = []
        for item in value:
            flat.extend(_flatten(item))
        return flat
    return [value]


def _to_torch(torch: Any, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value
    return torch.from_dlpack(value)


def _build_symbolic(mod: tvm.IRModule, target: Any, report: CaptureReport) -> Any:
    """A module with symbolic sizes: TVM's pipeline with dlight's CPU rules where they apply (reductions,
    GEMV); no tuning (records are per static shape)."""
    with target, tvm.transform.PassContext(opt_level=3):
        lowered = relax.get_pipeline("zero")(mod)
        lowered = dlight.ApplyDefaultSchedule(dlight.cpu.GEMV(), dlight.cpu.Reduction())(lowered)
    report.kernels = []
    report.notes.append("symbolic shapes: compiled untuned (records are kept per static shape)")
    return tvm.compile(lowered, target=target)


def _input_shapes(program: Any) -> list[tuple[int | str, ...]]:
    """The shapes of the program's fed inputs (symbolic sizes by name)."""
    user = set(program.graph_signature.user_inputs)
    return [
        tuple(d if isinstance(d, int) else str(d) for d in node.meta["val"].shape)
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in user
    ]
