"""Exact vs fast math: softmax, exp and erf kernels as TVM builds them, with and without Kiln's fast math.

    .venv/bin/python bench/fast_math.py [--shape 1,4,128,128]

Each operator on an fp32 tensor of ``shape`` (default: the BERT-style encoder's attention scores) goes
through Kiln's path for one kernel: Relax, ``FastMathTransform`` or not (``KILN_FAST_MATH``), legalization
and fusion; then each resulting task is built unscheduled and with its default schedule
(``schedules/defaults.py``) where a rule applies, and timed with TVM's time evaluator (median of 5
repeats of 50 calls), all in this one process, one after the other. Untuned: what the search starts from.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import fmt, load_line, start_run, table

from kiln_tvm import ms, relax, tvm
from schedules.defaults import default_schedule
from tuner.targets import host_target, to_tvm_target

OPERATORS: dict[str, Callable[[Any], Any]] = {
    "softmax (last axis)": lambda x: relax.op.nn.softmax(x, axis=-1),
    "exp": relax.op.exp,
    "erf": relax.op.erf,
}


def tasks(op: Callable[[Any], Any], shape: tuple[int, ...], fast: bool, target: Any) -> list[Any]:
    """The tuning tasks of ``op`` on a ``shape`` tensor."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(op(x)))
        bb.emit_func_output(out)
    mod = bb.get()
    if fast:
        mod = relax.transform.FastMathTransform()(mod)
    with target:
        mod = relax.get_pipeline("zero")(mod)
    return list(ms.relax_integration.extract_tasks(mod, target))


def time_us(mod: tvm.IRModule, target: Any) -> float:
    """Median µs of one call of the built ``mod``."""
    lib = tvm.compile(mod, target=target)
    rng = np.random.default_rng(0)
    args = [
        tvm.runtime.tensor(rng.standard_normal([int(d) for d in a.shape]).astype("float32"))
        for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    ]
    return float(lib.mod.time_evaluator("main", tvm.cpu(), number=50, repeat=5)(*args).median) * 1e6


def main() -> None:
    """Build and time every operator both ways; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1,4,128,128")
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))
    start_run("fast_math")
    target = to_tvm_target(host_target())
    rows = []
    for name, op in OPERATORS.items():
        exact: dict[str, float] = {}
        for fast in (False, True):
            for task in tasks(op, shape, fast, target):
                mod = task.dispatched[0]
                sch = default_schedule(mod, target)
                for label, scheduled in [("unscheduled", mod)] + (
                    [("default schedule", sch.mod)] if sch else []
                ):
                    us = time_us(scheduled, target)
                    if not fast:
                        exact[label] = us
                    base = exact.get(label, exact.get("unscheduled"))
                    rows.append(
                        [
                            name,
                            "fast" if fast else "exact",
                            str(task.task_name),
                            label,
                            fmt(us, ".1f"),
                            fmt(base / us if fast and base else None, ".1f"),
                        ]
                    )
    print(load_line())
    print(f"shape {list(shape)}, fp32")
    print(table(["operator", "math", "task", "schedule", "µs", "exact / fast"], rows))


if __name__ == "__main__":
    main()
