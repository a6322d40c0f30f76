"""Kiln's default-schedule rules against the kernels unscheduled and dlight's rule, and against the
machine's measured memory bandwidth; and the analytic schedules of the contractions against the other
schedules Kiln builds without measuring and against the machine's measured FMA peak.

    .venv/bin/python bench/default_schedules.py [--target JSON] [--only rows|contractions]

The second table: float32 matmuls, a batched matmul and NHWC convolutions at the held-out models' shapes
(BERT and GPT-2's projections and FFN, attention's scores, ResNet-18's 3x3 convolutions at each stage, its
7x7 stem and a 1x1 downsampling, ViT's 16x16 patch embedding), each built with Kiln's analytic schedule
(``schedules/analytic.py``), the polyhedral model's best-ranked tiling and a sample of MetaSchedule's design
space, and timed in this process (median of 7 repeats of at least 200 ms). Their weights are constants
re-laid-out in each schedule's order, as in Kiln's plans, so their outputs differ in layout and are not
compared here (``tests/unit/test_analytic_schedules.py`` checks the values). ``% of peak`` is the kernel's FLOPs per second over the fp32 FMA peak
``kiln machine`` measured on this machine's threads (the roofline of these compute-bound kernels). With
``--target`` (e.g. ``{"kind":"llvm","mcpu":"haswell","num-cores":2}`` on an AVX-512 machine: the AVX2 path)
the kernels are built for that CPU instead, which must run here.

Each kernel at the BERT-style encoder's shapes (softmax over 1x4x128x128 attention scores with fast
math, layer norm over 1x128x256 hidden states, the keys' split into heads transposed for Q.K^T,
1x128x256 -> 1x4x64x128) goes through Kiln's path for one kernel (Relax, fast math, legalization,
fusion), then is built unscheduled, with dlight's CPU ``Reduction`` rule where it applies (scalar
reductions), and with Kiln's rule (``schedules/row_reduction.py``: vectorized reductions;
``schedules/transpose.py``: tiled transposition). Each is timed with TVM's time evaluator (median of 5
repeats of 200 calls) in this one process. GB/s counts the kernel's arguments once (inputs read, output
written): at these shapes they fit in L2, so a kernel can beat the DRAM bandwidth ``kiln machine``
reports.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import fmt, load_line, start_run, table

from kiln_tvm import dlight, estimate_flops, ms, physical_core_count, relax, tvm
from schedules.analytic import analytic_schedule
from schedules.anatomy import argument_bytes
from schedules.defaults import default_schedule
from schedules.isa import isa_profile
from schedules.loops import fp32_lanes
from schedules.poly.caches import host_caches
from schedules.poly.search import seed_schedules
from schedules.poly.tiling import MachineModel
from tuner.passes.plan import lower_graph
from tuner.schedule_choice import design_space_sample, task_context
from tuner.targets import resolve_target, to_tvm_target

KERNELS: dict[str, tuple[tuple[int, ...], Callable[..., Any]]] = {
    "softmax 1x4x128x128": ((1, 4, 128, 128), lambda x: relax.op.nn.softmax(x, axis=-1)),
    "layer norm 1x128x256": (
        (1, 128, 256),
        lambda x, g, b: relax.op.nn.layer_norm(x, g, b, axes=[-1], epsilon=1e-5),
    ),
    "key transpose 1x128x256 -> 1x4x64x128": (
        (1, 128, 256),
        lambda x: relax.op.permute_dims(relax.op.reshape(x, (1, 128, 4, 64)), [0, 2, 3, 1]),
    ),
}


def kernel(shape: tuple[int, ...], op: Callable[..., Any], target: Any) -> tvm.IRModule:
    """The one task of ``op`` on a ``shape`` tensor (with per-feature weights where ``op`` takes them)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    params = [x]
    if op.__code__.co_argcount == 3:
        params += [relax.Var(n, relax.TensorType((shape[-1],), "float32")) for n in ("gamma", "beta")]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(op(*params)))
        bb.emit_func_output(out)
    mod = relax.transform.FastMathTransform()(bb.get())
    with target:
        mod = relax.get_pipeline("zero")(mod)
    (task,) = ms.relax_integration.extract_tasks(mod, target)
    return task.dispatched[0]


def time_us(
    mod: tvm.IRModule, target: Any, *, number: int = 200, repeat: int = 5, min_repeat_ms: int = 0
) -> tuple[float, np.ndarray]:
    """Median µs of one call of the built ``mod`` on seeded random arguments, and its output."""
    lib = tvm.compile(mod, target=target)
    rng = np.random.default_rng(0)
    args = [
        tvm.runtime.tensor(rng.standard_normal([int(d) for d in a.shape]).astype("float32"))
        for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    ]
    evaluator = lib.mod.time_evaluator(
        "main", tvm.cpu(), number=number, repeat=repeat, min_repeat_ms=min_repeat_ms
    )
    return float(evaluator(*args).median) * 1e6, args[-1].numpy()


CONTRACTIONS: dict[str, tuple[list[tuple[int, ...]], Callable[..., Any]]] = {
    "matmul 128x768x768 + bias (BERT projection)": (
        [(1, 128, 768), (768, 768), (768,)],
        lambda x, w, b: relax.op.add(relax.op.matmul(x, w), b),
    ),
    "matmul 128x768x3072 + bias (FFN up)": (
        [(1, 128, 768), (768, 3072), (3072,)],
        lambda x, w, b: relax.op.add(relax.op.matmul(x, w), b),
    ),
    "matmul 128x3072x768 + bias (FFN down)": (
        [(1, 128, 3072), (3072, 768), (768,)],
        lambda x, w, b: relax.op.add(relax.op.matmul(x, w), b),
    ),
    "batched matmul 12x128x64x128 (attention scores)": (
        [(12, 128, 64), (12, 64, 128)],
        lambda q, k: relax.op.matmul(q, k),
    ),
    "conv 3x3 56x56 64->64 NHWC": ([(1, 56, 56, 64), (64, 3, 3, 64)], lambda x, w: _conv(x, w, 1, 1)),
    "conv 3x3 28x28 128->128 NHWC": ([(1, 28, 28, 128), (128, 3, 3, 128)], lambda x, w: _conv(x, w, 1, 1)),
    "conv 3x3 14x14 256->256 NHWC": ([(1, 14, 14, 256), (256, 3, 3, 256)], lambda x, w: _conv(x, w, 1, 1)),
    "conv 3x3 7x7 512->512 NHWC": ([(1, 7, 7, 512), (512, 3, 3, 512)], lambda x, w: _conv(x, w, 1, 1)),
    "conv 7x7/2 224x224 3->64 NHWC (stem)": (
        [(1, 224, 224, 3), (64, 7, 7, 3)],
        lambda x, w: _conv(x, w, 3, 2),
    ),
    "conv 1x1/2 56x56 64->128 NHWC": ([(1, 56, 56, 64), (128, 1, 1, 64)], lambda x, w: _conv(x, w, 0, 2)),
    "conv 16x16/16 224x224 3->384 NHWC (ViT patches)": (
        [(1, 224, 224, 3), (384, 16, 16, 3)],
        lambda x, w: _conv(x, w, 0, 16),
    ),
}


def _conv(x: Any, w: Any, padding: int, stride: int) -> Any:
    return relax.op.nn.conv2d(x, w, strides=stride, padding=padding, data_layout="NHWC", kernel_layout="OHWI")


def contraction_task(shapes: list[tuple[int, ...]], op: Callable[..., Any], target: Any) -> tvm.IRModule:
    """The one task of ``op`` over a float32 input of ``shapes[0]`` and, after it, weights of the other
    shapes (constants, re-laid-out at compile time as in Kiln's plan; both operands of a batched matmul
    are inputs), lowered as Kiln lowers a model (:func:`tuner.passes.plan.lower_graph`)."""
    rng = np.random.default_rng(0)
    weights = [] if len(shapes) == 2 and len(shapes[0]) == len(shapes[1]) == 3 else shapes[1:]
    inputs = shapes[: len(shapes) - len(weights)]
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(inputs)]
    constants = [relax.const(rng.standard_normal(s).astype("float32")) for s in weights]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(op(*params, *constants)))
        bb.emit_func_output(out)
    lowered = lower_graph(bb.get(), target, weight_prepack=True)
    tasks = [
        t for t in ms.relax_integration.extract_tasks(lowered, target) if estimate_flops(t.dispatched[0]) > 0
    ]
    (task,) = tasks
    return task.dispatched[0]


def contractions(target: Any, mach: dict[str, Any]) -> None:
    """Build and time every contraction with each schedule Kiln builds without measuring; print the table."""
    caches = host_caches()
    peak = mach["peak_gflops"]
    rows = []
    for name, (shapes, op) in CONTRACTIONS.items():
        mod = contraction_task(shapes, op, target)
        flops = estimate_flops(mod)
        context = task_context(mod, target, name, "cpu", caches=caches, cores=physical_core_count())
        poly = task_context(mod, target, name, "cpu-poly", caches=caches, cores=physical_core_count())
        machine_model = MachineModel(fp32_lanes(target), physical_core_count(), caches)
        candidates = [
            ("analytic", analytic_schedule(context, isa_profile(target))),
            ("polyhedral model", next(iter(seed_schedules(poly, machine_model, 1, unmeasured=True)), None)),
            ("design-space sample", design_space_sample(context)),
        ]
        for label, sch in candidates:
            if sch is None:
                rows.append([name, label, "does not apply", "", ""])
                continue
            # Weights in the layout the schedule rewrote them to: the outputs are not compared (the unit
            # tests check the values).
            us, _ = time_us(sch.mod, target, number=1, repeat=7, min_repeat_ms=200)
            rows.append(
                [
                    name,
                    label,
                    fmt(us, ".1f"),
                    fmt(flops / us / 1e3, ".1f"),
                    fmt(100 * flops / us / 1e3 / peak, ".0f"),
                ]
            )
        print(f"  {name}: done", file=sys.stderr)
    print(load_line())
    print(
        f"ISA profile: {fp32_lanes(target)} fp32 lanes, {isa_profile(target).vector_registers} vector registers"
    )
    print(
        table(
            ["kernel", "schedule", "µs", "GFLOP/s", "% of peak"],
            rows,
        )
    )


def main() -> None:
    """Build and time every kernel; print the tables."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default=None, help="a target JSON dict (default: this CPU)")
    parser.add_argument("--only", choices=["rows", "contractions"], default=None)
    args = parser.parse_args()
    _, _, mach = start_run("default_schedules")
    target = to_tvm_target(resolve_target(args.target or "host"))
    if args.only != "rows":
        contractions(target, mach)
    if args.only == "contractions":
        return
    rows = []
    for name, (shape, op) in KERNELS.items():
        mod = kernel(shape, op, target)
        moved = argument_bytes(mod["main"])
        dl = dlight.cpu.Reduction().apply(mod["main"], target, False)
        kiln = default_schedule(mod, target)
        reference = None
        for label, scheduled in [
            ("unscheduled", mod),
            ("dlight Reduction", dl.mod if dl else None),
            ("Kiln default schedule", kiln.mod if kiln else None),
        ]:
            if scheduled is None:
                rows.append([name, label, "does not apply", "", "", ""])
                continue
            us, out = time_us(scheduled, target)
            reference = out if reference is None else reference
            rows.append(
                [
                    name,
                    label,
                    fmt(us, ".1f"),
                    fmt(moved / us / 1e3, ".1f"),
                    fmt(100 * moved / us / 1e3 / mach["bandwidth_gbs"], ".0f"),
                    fmt(float(np.abs(out - reference).max()), ".1e"),
                ]
            )
    print(load_line())
    print(
        table(
            ["kernel", "schedule", "µs", "GB/s", "% of DRAM triad", "max abs diff vs unscheduled"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
