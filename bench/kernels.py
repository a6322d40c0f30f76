"""Where a compiled model's time goes: each kernel call timed inside the model, against the same kernel's
latency measured while tuning.

    .venv/bin/python bench/kernels.py ARTIFACT_DIR INPUTS_NPZ [--calls 200]

ARTIFACT_DIR is an unpacked Kiln artifact (``model.so`` and ``manifest.json``), INPUTS_NPZ the model's
inputs in call order (``bench/models.py`` leaves both under its work directory). In a fresh process the
model runs ``calls`` times plain (the end-to-end median), then as many times with a Relax VM instrument that
timestamps every call instruction: each kernel's mean time per model call, in the model, next to the
weight x best latency the tuning measured for it (in a hot loop, alone). An instrument that does nothing
is timed too, so that its own cost per call is subtracted. What is left of the end-to-end time once the
kernels are summed is the VM's own work (dispatch, allocation, builtins).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _report import fmt, load_line, table


def _child(artifact: Path, inputs_npz: Path, calls: int) -> dict[str, Any]:
    import numpy as np

    from kiln_tvm import relax, tvm

    dev = tvm.cpu()
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(artifact / "model.so")), dev)
    params = (
        list(vm["main_transform_params"]([]))
        if vm.module.implements_function("main_transform_params")
        else []
    )
    with np.load(inputs_npz) as data:
        args = [tvm.runtime.tensor(data[k], dev) for k in data.files] + params
    main = vm["main"]

    def timed(n: int) -> float:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            main(*args)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    timed(20)
    plain_s = timed(calls)

    def noop(*_: Any) -> int:
        return 0

    vm.set_instrument(noop)
    timed(5)
    noop_s = timed(calls)

    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    started: list[float] = []

    def instrument(_func: Any, symbol: str, before: bool, *_: Any) -> int:
        now = time.perf_counter()
        if before:
            started.append(now)
        else:
            totals[str(symbol)] += now - started.pop()
            counts[str(symbol)] += 1
        return 0

    vm.set_instrument(instrument)
    timed(5)
    totals.clear()
    counts.clear()
    instrumented_s = timed(calls)
    instr_calls = sum(counts.values()) / calls
    return {
        "plain_ms": plain_s * 1e3,
        "noop_instrument_ms": noop_s * 1e3,
        "instrumented_ms": instrumented_s * 1e3,
        "calls_per_model": instr_calls,
        "kernels": {k: {"ms": totals[k] / calls * 1e3, "calls": counts[k] / calls} for k in totals},
    }


def _task_for(symbol: str, tasks: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The manifest task of a kernel symbol (the lowered function's name, ``_prepacked`` when its weights
    were re-laid-out; a task's name may end in one digit more, where MetaSchedule renamed it)."""
    symbol = symbol.removesuffix("_prepacked")
    if symbol in tasks:
        return tasks[symbol]
    for name, task in tasks.items():
        if re.fullmatch(re.escape(symbol) + r"\d?", name):
            return task
    return None


def main() -> None:
    """Time in a child, then print the per-kernel table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("inputs", type=Path)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.artifact, args.inputs, args.calls)))
        return
    print(load_line())
    proc = subprocess.run(
        [sys.executable, __file__, str(args.artifact), str(args.inputs), f"--calls={args.calls}", "--child"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    manifest = json.loads((args.artifact / "manifest.json").read_text())
    tasks = {t["name"]: t for t in manifest["tasks"]}
    # The instrument's own cost per call instruction, from the instrument that does nothing.
    per_call_ms = (res["noop_instrument_ms"] - res["plain_ms"]) / max(1.0, res["calls_per_model"])
    rows, in_model, tuned, builtins = [], 0.0, 0.0, 0.0
    for symbol, k in sorted(res["kernels"].items(), key=lambda kv: -kv[1]["ms"]):
        ms = max(0.0, k["ms"] - per_call_ms * k["calls"])
        task = _task_for(symbol, tasks)
        if task is None:
            builtins += ms
            continue
        best = task["best_latency_us"] / 1e3 * k["calls"] if task.get("best_latency_us") else None
        in_model += ms
        tuned += best or 0.0
        rows.append(
            [
                symbol,
                fmt(k["calls"], ".0f"),
                fmt(ms * 1e3, ".1f"),
                fmt(best and best * 1e3, ".1f"),
                fmt(best and ms / best, ".2f"),
            ]
        )
    print(table(["kernel", "calls", "in model µs", "tuned µs (x calls)", "in model / tuned"], rows))
    print()
    print(
        f"end to end (median of {args.calls}): {res['plain_ms']:.3f} ms; "
        f"instrument cost {per_call_ms * 1e3:.2f} µs per call instruction ({res['calls_per_model']:.0f} per model)"
    )
    print(
        f"Σ kernels in the model: {in_model:.3f} ms; Σ tuned latencies: {tuned:.3f} ms "
        f"(in model / tuned {in_model / tuned:.2f})"
    )
    print(
        f"builtins (allocation, shape checks...): {builtins:.3f} ms; the rest (VM dispatch): "
        f"{res['plain_ms'] - in_model - builtins:.3f} ms"
    )


if __name__ == "__main__":
    main()
