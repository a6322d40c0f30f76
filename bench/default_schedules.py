"""Kiln's default-schedule rules against the kernels unscheduled and dlight's rule, and against the
machine's measured memory bandwidth.

    .venv/bin/python bench/default_schedules.py

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

from collections.abc import Callable
from typing import Any

import numpy as np
from _report import fmt, load_line, start_run, table

from kiln_tvm import dlight, ms, relax, tvm
from schedules.anatomy import argument_bytes
from schedules.defaults import default_schedule
from tuner.targets import host_target, to_tvm_target

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


def time_us(mod: tvm.IRModule, target: Any) -> tuple[float, np.ndarray]:
    """Median µs of one call of the built ``mod``, and its output."""
    lib = tvm.compile(mod, target=target)
    rng = np.random.default_rng(0)
    args = [
        tvm.runtime.tensor(rng.standard_normal([int(d) for d in a.shape]).astype("float32"))
        for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    ]
    evaluator = lib.mod.time_evaluator("main", tvm.cpu(), number=200, repeat=5)
    return float(evaluator(*args).median) * 1e6, args[-1].numpy()


def main() -> None:
    """Build and time every kernel three ways; print the table."""
    _, _, mach = start_run("default_schedules")
    target = to_tvm_target(host_target())
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
