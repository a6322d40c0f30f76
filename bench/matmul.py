"""fp32 matmul C = A @ B (N x N): Kiln-tuned kernel vs NumPy/OpenBLAS vs untuned TVM, side by side.

    .venv/bin/python bench/matmul.py [--sizes 512,1024] [--trials 64] [--quick]

For each N an ONNX model ``C = MatMul(A, B)`` with both operands as inputs is tuned through Kiln's
product path (register_model, submit_job, run_job, in a fresh store under bench/work/), and the
artifact's model.so is timed with plain TVM in its own process. NumPy ``A @ B`` is timed twice, in
separate processes: with the environment as it is, and with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
removed from that child's environment only. Untuned TVM is plain ``tvm.compile`` of the same import.
Every figure is the median of many calls of the same perf_counter loop (bench/_timing.py).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from _kiln import tune
from _report import (
    OPENBLAS_VARS,
    command_line,
    fmt,
    load_line,
    manifest_line,
    openblas_line,
    start_run,
    table,
    write_json,
)
from _timing import Reps, interleaved, load_outputs, reps_for, save_inputs, time_in_fresh_process
from onnx import TensorProto, helper

RTOL = 1e-4


def matmul_onnx(n: int, path: Path) -> Path:
    """An ONNX model C = MatMul(A, B) with A and B fp32 [n, n] inputs (no weights)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["C"], name="matmul")],
        f"matmul{n}",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in ("A", "B")],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, [n, n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def check(actual: np.ndarray, expected: np.ndarray) -> dict[str, Any]:
    """allclose with rtol 1e-4; the absolute floor is 1e-4 of the output's scale (elements that cancel)."""
    scale = float(np.abs(expected).max())
    diff = np.abs(actual.astype(np.float64) - expected)
    return {
        "allclose": bool(np.allclose(actual, expected, rtol=RTOL, atol=RTOL * scale)),
        "rtol": RTOL,
        "atol": RTOL * scale,
        "max_abs_error": float(diff.max()),
        "max_error_rel_to_scale": float(diff.max() / scale),
    }


def bench_size(n: int, trials: int, reps: Reps, work: Path, peak: float, seed: int) -> dict[str, Any]:
    """Tune and time one size; returns the raw results."""
    label = f"matmul{n}"
    kiln = tune(matmul_onnx(n, work / f"{label}.onnx"), work / "kiln", trials, label, seed)
    rng = np.random.default_rng(seed)
    inputs = {x: rng.standard_normal((n, n), dtype=np.float32) for x in ("A", "B")}
    npz = save_inputs(work / f"{label}-inputs.npz", inputs)
    timers = {
        "kiln": lambda: time_in_fresh_process("tvm", kiln.model_so, npz, reps, out_dir=work / label / "kiln"),
        "numpy": lambda: time_in_fresh_process(
            "numpy-matmul", None, npz, reps, out_dir=work / label / "numpy"
        ),
        "numpy_openblas_unset": lambda: time_in_fresh_process(
            "numpy-matmul", None, npz, reps, unset_env=OPENBLAS_VARS, out_dir=work / label / "numpy-unset"
        ),
    }
    runs = interleaved(timers, reps.rounds)
    # Untuned TVM takes seconds per call at these sizes: one round is plenty to show the gap.
    runs["untuned"] = time_in_fresh_process(
        "tvm", kiln.untuned_so, npz, reps, out_dir=work / label / "untuned"
    )
    flop = 2.0 * n**3
    for r in runs.values():
        r["gflops"] = flop / (r["ms"] * 1e-3) / 1e9
        r["percent_of_peak"] = 100.0 * r["gflops"] / peak if peak else None
        r["kiln_speedup"] = r["ms"] / runs["kiln"]["ms"]
    reference = load_outputs(runs["numpy"])[0]
    return {
        "n": n,
        "flop": flop,
        "runs": runs,
        "correctness": {
            "kiln_vs_numpy": check(load_outputs(runs["kiln"])[0], reference),
            "untuned_vs_numpy": check(load_outputs(runs["untuned"])[0], reference),
        },
        "kiln": {k: v for k, v in vars(kiln).items() if k != "inputs"},
    }


LABELS = {
    "kiln": "Kiln tuned ({trials} trials)",
    "numpy": "NumPy A @ B (env as is)",
    "numpy_openblas_unset": "NumPy A @ B (OPENBLAS_CORETYPE/L2_SIZE unset)",
    "untuned": "TVM untuned (tvm.compile)",
}


def report(results: list[dict[str, Any]], trials: int) -> str:
    """The markdown tables for RESULTS.md."""
    rows = []
    for res in results:
        for key, r in res["runs"].items():
            rows.append(
                [
                    res["n"],
                    LABELS[key].format(trials=trials),
                    fmt(r["ms"]),
                    f"{fmt(r['p10_ms'])}-{fmt(r['p90_ms'])}",
                    r["calls"],
                    fmt(r["gflops"], ".1f"),
                    fmt(r["percent_of_peak"], ".0f"),
                    "1.00" if key == "kiln" else fmt(r["kiln_speedup"], ".2f"),
                ]
            )
    timing = table(
        [
            "N",
            "implementation",
            "median ms",
            "p10-p90 ms",
            "calls",
            "GFLOP/s",
            "% of peak",
            "peer ms / Kiln ms",
        ],
        rows,
    )
    tuning_rows = [
        [
            res["n"],
            f"{res['kiln']['trials_done']}/{res['kiln']['trials']}",
            res["kiln"]["tasks"],
            fmt(res["kiln"]["stage_s"].get("tuning"), ".1f"),
            fmt(res["kiln"]["job_wall_s"], ".1f"),
            f"{res['correctness']['kiln_vs_numpy']['allclose']} "
            f"(max abs {res['correctness']['kiln_vs_numpy']['max_abs_error']:.2e})",
        ]
        for res in results
    ]
    tuning = table(
        ["N", "trials done", "tasks", "tuning s", "whole job s", "Kiln == NumPy (rtol 1e-4)"], tuning_rows
    )
    return timing + "\n\n" + tuning


def main() -> None:
    """Parse arguments, run every size, print the tables and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="512,1024", help="comma-separated N (default 512,1024)")
    parser.add_argument(
        "--trials", type=int, default=None, help="Kiln trials per size (default 64; 8 with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: 8 trials, few timed calls")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    trials = args.trials if args.trials is not None else (8 if args.quick else 64)
    reps = reps_for(args.quick, None)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    run_stamp, work, mach = start_run("matmul")
    print(
        f"timing: median of {reps.calls} calls after {reps.warmup} warmups, each implementation in its own process"
    )

    results = [bench_size(n, trials, reps, work, mach["peak_gflops"], args.seed) for n in sizes]

    print()
    for res in results:
        for key in ("numpy", "numpy_openblas_unset"):
            print(f"N={res['n']} {LABELS[key]}: {openblas_line(res['runs'][key])}")
    for res in results:
        print(manifest_line(f"N={res['n']}", res["kiln"]["manifest"]))
    print(f"at the end: {load_line()}")
    print()
    print(report(results, trials))
    print()
    print(
        "peer ms / Kiln ms > 1: Kiln is that many times faster. % of peak: of "
        + f"{mach['peak_gflops']:.1f} GFLOP/s."
    )
    payload = {
        "script": "matmul",
        "command": command_line(),
        "stamp": run_stamp,
        "trials": trials,
        "reps": vars(reps),
        "machine": mach,
        "load_average_end": os.getloadavg(),
        "results": results,
    }
    print(f"raw results: {write_json('matmul', run_stamp, payload)}")


if __name__ == "__main__":
    main()
