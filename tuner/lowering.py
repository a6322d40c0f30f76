"""A model's lowering, level by level: the Relax program after each of Kiln's graph passes, and what each
pass changed.

:func:`recording_levels` watches the passes run inside it through a TVM pass instrument and keeps one
level per *step*: a pass that is not a ``Sequential`` and not a wrapper around one (TVM's ``zero``
pipeline is a module pass running a ``Sequential`` of LegalizeOps, AnnotateTIROpPattern, FoldConstant,
FuseOps and FuseTIR on the same module: those five are the steps). Passes a step runs on other modules
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


@dataclass
class _Frame:
    name: str
    mod: tvm.IRModule  # the module the pass was given
    started: float
    children: list[_Frame] = field(default_factory=list)
    output: tvm.IRModule | None = None
    seconds: float = 0.0
    is_sequential: bool = False

    def steps(self) -> list[_Frame]:
        """The steps this pass stands for: itself, or, for a Sequential or a wrapper of one, its children's."""
        wraps = any(c.is_sequential and c.mod.same_as(self.mod) for c in self.children)
        if self.is_sequential or wraps:
            return [step for child in self.children for step in child.steps()]
        return [self]


class LevelRecorder:
    """Collects the steps of the passes run while it is installed (see :func:`recording_levels`)."""

    def __init__(self) -> None:
        self._open: list[_Frame] = []
        self._done: list[_Frame] = []
        self.first: tvm.IRModule | None = None

    def before(self, mod: tvm.IRModule, info: Any) -> None:
        if self.first is None:
            self.first = mod
        name = str(info.name)
        frame = _Frame(name, mod, time.perf_counter(), is_sequential=name == "sequential")
        (self._open[-1].children if self._open else self._done).append(frame)
        self._open.append(frame)

    def after(self, mod: tvm.IRModule, _info: Any) -> None:
        frame = self._open.pop()
        frame.output = mod
        frame.seconds = time.perf_counter() - frame.started

    def levels(self) -> list[IrLevel]:
        """The imported program, then one level per step, in the order they ran."""
        if self.first is None:
            return []
        steps = [step for frame in self._done for step in frame.steps()]
        text = relax_text(self.first)
        histogram = operator_histogram(self.first)
        levels = [_level(0, IMPORTED, self.first, text, True, histogram, histogram, 0.0)]
        for position, step in enumerate(steps, start=1):
            assert step.output is not None
            after_text = relax_text(step.output)
            after = operator_histogram(step.output)
            changed = after_text != text
            shown = after_text if changed else ""
            levels.append(
                _level(position, step.name, step.output, shown, changed, histogram, after, step.seconds)
            )
            text, histogram = after_text, after
        return levels


def _level(
    position: int,
    name: str,
    mod: tvm.IRModule,
    text: str,
    changed: bool,
    before: dict[str, int],
    after: dict[str, int],
    seconds: float,
) -> IrLevel:
    delta = {op: after.get(op, 0) - before.get(op, 0) for op in sorted(set(before) | set(after))}
    return IrLevel(
        position=position,
        name=name,
        text=text,
        changed=changed,
        operators_before=sum(before.values()),
        operators_after=sum(after.values()),
        histogram=dict(sorted(after.items())),
        delta={op: d for op, d in delta.items() if d},
        kernels=kernel_calls(after),
        prim_funcs=sum(isinstance(f, tvm.tirx.PrimFunc) for f in mod.functions.values()),
        seconds=round(seconds, 6),
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
