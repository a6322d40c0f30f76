"""A model's lowering, level by level: the Relax program after each of Kiln's graph passes, and what each
pass changed.

:func:`recording_levels` watches the passes run inside it through a TVM pass instrument and keeps one
level per *step*: a pass that is not a ``Sequential`` and not a wrapper around one (Kiln's lowering runs
TVM's ``zero`` pipeline as a ``Sequential`` of LegalizeOps, AnnotateTIROpPattern, Kiln's
KilnLookupsAsElementwise, FoldConstant, FuseOps and FuseTIR: those six are the steps). Passes a step runs on other modules
(FoldConstant builds and runs the kernels that evaluate constants, with TIR's whole pipeline) and passes
nested in a step (the DeadCodeElimination a Kiln pass ends with) belong to that step.

A level's text is the module's Relax functions as TVMScript (the TIR kernels are shown per task; the
weights stay out, as metadata references). A step that left that text as it was is kept as a level
without a text of its own, so the pipeline reads whole and nothing is stored twice.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kiln_tvm import relax, tvm
from tuner.entities import IrLevel

#: The name of the level before any pass.
IMPORTED = "imported"
_KERNEL_CALLS = ("relax.call_tir", "relax.call_tir_inplace")


def operator_histogram(mod: tvm.IRModule) -> dict[str, int]:
    """Count the Relax operator calls (``relax.nn.conv2d``...) in every Relax function of ``mod``."""
    counts: Counter[str] = Counter()

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            counts[str(expr.op.name)] += 1

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return dict(counts)


def kernel_calls(histogram: dict[str, int]) -> int:
    """Calls of TIR kernels in an operator histogram."""
    return sum(n for op, n in histogram.items() if op in _KERNEL_CALLS)


def relax_text(mod: tvm.IRModule) -> str:
    """The Relax functions of ``mod`` as TVMScript, without its TIR functions."""
    graph = {gvar: func for gvar, func in mod.functions.items() if isinstance(func, relax.Function)}
    return tvm.IRModule(graph).script()


@dataclass(frozen=True)
class _Step:
    """What a step left: the program's text and operators after it (computed as it ends, so that the
    intermediate modules, and the weights only they hold, are not kept until the end)."""

    name: str
    text: str
    histogram: dict[str, int]
    prim_funcs: int
    seconds: float

    @classmethod
    def of(cls, name: str, mod: tvm.IRModule, seconds: float) -> _Step:
        prim_funcs = sum(isinstance(f, tvm.tirx.PrimFunc) for f in mod.functions.values())
        return cls(name, relax_text(mod), operator_histogram(mod), prim_funcs, seconds)


@dataclass
class _Frame:
    name: str
    info: Any  # the pass's PassInfo: its end is reported with the same object
    mod: tvm.IRModule | None  # the module the pass was given, while it runs
    started: float
    on_parent_input: bool  # given the very module its parent was given
    is_sequential: bool
    #: Whether it can be a step: not run inside a step (on a module of the step's own making).
    may_be_step: bool
    children: list[_Frame] = field(default_factory=list)
    steps: list[_Step] = field(default_factory=list)


class LevelRecorder:
    """Collects the steps of the passes run while it is installed (see :func:`recording_levels`)."""

    def __init__(self) -> None:
        self._open: list[_Frame] = []
        self._steps: list[_Step] = []
        self._first: _Step | None = None

    def before(self, mod: tvm.IRModule, info: Any) -> None:
        if self._first is None:
            self._first = _Step.of(IMPORTED, mod, 0.0)
        name = str(info.name)
        parent = self._open[-1] if self._open else None
        on_input = parent is not None and parent.mod is not None and mod.same_as(parent.mod)
        may_be_step = parent is None or (parent.may_be_step and (parent.is_sequential or on_input))
        frame = _Frame(name, info, mod, time.perf_counter(), on_input, name == "sequential", may_be_step)
        if parent is not None:
            parent.children.append(frame)
        self._open.append(frame)

    def after(self, mod: tvm.IRModule, info: Any) -> None:
        # A pass that raised never reports its end: when a guard (tuner.passes.guarded) caught its failure,
        # the frames it and its children opened are still above the one ending now, and are dropped.
        while len(self._open) > 1 and not self._open[-1].info.same_as(info):
            self._open.pop()
        frame = self._open.pop()
        seconds = time.perf_counter() - frame.started
        # A Sequential, or a pass wrapping one run on its own input (the zero pipeline), stands for its
        # children's steps; any other pass is a step, whatever it ran inside.
        wraps = any(c.is_sequential and c.on_parent_input for c in frame.children)
        if not frame.may_be_step:
            frame.steps = []
        elif frame.is_sequential or wraps:
            frame.steps = [step for child in frame.children for step in child.steps]
        else:
            frame.steps = [_Step.of(frame.name, mod, seconds)]
        frame.mod, frame.children = None, []
        if not self._open:
            self._steps.extend(frame.steps)

    def levels(self) -> list[IrLevel]:
        """The imported program, then one level per step, in the order they ran."""
        if self._first is None:
            return []
        first = self._first
        levels = [_level(0, first, True, first.histogram)]
        previous = first
        for position, step in enumerate(self._steps, start=1):
            changed = step.text != previous.text
            levels.append(_level(position, step, changed, previous.histogram))
            previous = step
        return levels


def _level(position: int, step: _Step, changed: bool, before: dict[str, int]) -> IrLevel:
    after = step.histogram
    delta = {op: after.get(op, 0) - before.get(op, 0) for op in sorted(set(before) | set(after))}
    return IrLevel(
        position=position,
        name=step.name,
        text=step.text if changed else "",
        changed=changed,
        operators_before=sum(before.values()),
        operators_after=sum(after.values()),
        histogram=dict(sorted(after.items())),
        delta={op: d for op, d in delta.items() if d},
        kernels=kernel_calls(after),
        prim_funcs=step.prim_funcs,
        seconds=round(step.seconds, 6),
    )


@contextlib.contextmanager
def recording_levels(recorder: LevelRecorder | None) -> Iterator[None]:
    """Install ``recorder`` on the passes run inside (nothing with None), keeping the current pass
    context's settings."""
    if recorder is None:
        yield
        return

    @tvm.instrument.pass_instrument
    class _Instrument:
        def run_before_pass(self, mod: tvm.IRModule, info: Any) -> None:
            recorder.before(mod, info)

        def run_after_pass(self, mod: tvm.IRModule, info: Any) -> None:
            recorder.after(mod, info)

    current = tvm.transform.PassContext.current()
    with tvm.transform.PassContext(
        opt_level=current.opt_level,
        required_pass=list(current.required_pass),
        disabled_pass=list(current.disabled_pass),
        instruments=[*current.instruments, _Instrument()],
        config=dict(current.config),
    ):
        yield
