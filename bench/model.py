"""Bundled example models: Kiln-tuned vs untuned TVM vs onnxruntime vs PyTorch eager, side by side.

    .venv/bin/python bench/model.py [--models small_cnn,mlp] [--trials 300] [--quick]

Each model in examples/ is tuned through Kiln's product path (register_model, submit_job, run_job, in
a fresh store under bench/work/), and the artifact's model.so is timed with plain TVM in its own
process. Untuned TVM is plain ``tvm.compile`` of the same import. onnxruntime (CPUExecutionProvider,
default threads) runs the .onnx file. PyTorch eager runs a hand-written module holding the ONNX
initializers (bench/_torch_models.py), checked against onnxruntime's outputs before it is timed. All
get the same seeded input; every figure is the median of the same perf_counter loop (bench/_timing.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _kiln import tune
from _report import command_line, fmt, load_line, manifest_line, start_run, table, write_json
from _timing import Reps, interleaved, load_outputs, reps_for, save_inputs, time_in_fresh_process

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TORCH_TOLERANCE = 1e-4


def max_abs_error(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """Largest absolute difference over all outputs."""
    return max(float(np.abs(x.astype(np.float64) - y).max()) for x, y in zip(a, b, strict=True))


def bench_model(name: str, trials: int, reps: Reps, work: Path, seed: int) -> dict[str, Any]:
    """Tune and time one example model; returns the raw results."""
    onnx_path = EXAMPLES / f"{name}.onnx"
    kiln = tune(onnx_path, work / "kiln", trials, name, seed)
    npz = save_inputs(work / f"{name}-inputs.npz", kiln.inputs)
    skipped: dict[str, str] = {}
    timers: dict[str, Callable[[], dict[str, Any]]] = {
        "kiln": lambda: time_in_fresh_process("tvm", kiln.model_so, npz, reps, out_dir=work / name / "kiln"),
        "untuned": lambda: time_in_fresh_process(
            "tvm", kiln.untuned_so, npz, reps, out_dir=work / name / "untuned"
        ),
    }
    if importlib.util.find_spec("onnxruntime"):
        timers["onnxruntime"] = lambda: time_in_fresh_process(
            "onnxruntime", onnx_path, npz, reps, out_dir=work / name / "onnxruntime"
        )
    else:
        skipped["onnxruntime"] = "onnxruntime is not installed"
    if not importlib.util.find_spec("torch"):
        skipped["torch"] = "torch is not installed"
    elif "onnxruntime" not in timers:
        skipped["torch"] = "no onnxruntime outputs to check the PyTorch twin against"
    else:
        timers["torch"] = lambda: time_in_fresh_process(
            "torch",
            onnx_path,
            npz,
            reps,
            reference_npz=work / name / "onnxruntime" / "outputs.npz",
            tolerance=TORCH_TOLERANCE,
            out_dir=work / name / "torch",
        )
    runs = interleaved(timers, reps.rounds)
    for r in runs.values():
        r["kiln_speedup"] = r["ms"] / runs["kiln"]["ms"]
    errors = {}
    if "onnxruntime" in runs:
        ort = load_outputs(runs["onnxruntime"])
        errors = {
            "kiln_vs_onnxruntime": max_abs_error(load_outputs(runs["kiln"]), ort),
            "untuned_vs_onnxruntime": max_abs_error(load_outputs(runs["untuned"]), ort),
        }
    return {
        "model": name,
        "runs": runs,
        "skipped": skipped,
        "max_abs_error": errors,
        "kiln": {k: v for k, v in vars(kiln).items() if k != "inputs"},
    }


LABELS = {
    "kiln": "Kiln tuned ({trials} trials)",
    "untuned": "TVM untuned (tvm.compile)",
    "onnxruntime": "onnxruntime (CPU EP, default threads)",
    "torch": "PyTorch eager ({threads} threads, inference_mode)",
}


def report(results: list[dict[str, Any]], trials: int) -> str:
    """The markdown tables for RESULTS.md."""
    rows = []
    for res in results:
        for key, r in res["runs"].items():
            label = LABELS[key].format(trials=trials, threads=r["runtime"].get("torch_threads"))
            rows.append(
                [
                    res["model"],
                    label,
                    fmt(r["ms"]),
                    f"{fmt(r['p10_ms'])}-{fmt(r['p90_ms'])}",
                    r["calls"],
                    "1.00" if key == "kiln" else fmt(r["kiln_speedup"], ".2f"),
                ]
            )
        for key, why in res["skipped"].items():
            rows.append([res["model"], LABELS[key].split(" (")[0], f"skipped: {why}", "", "", ""])
    timing = table(["model", "implementation", "median ms", "p10-p90 ms", "calls", "peer ms / Kiln ms"], rows)
    tuning_rows = [
        [
            res["model"],
            f"{res['kiln']['trials_done']}/{res['kiln']['trials']}",
            res["kiln"]["tasks"],
            fmt(res["kiln"]["model_flops"] / 1e6, ".2f"),
            fmt(res["kiln"]["stage_s"].get("tuning"), ".1f"),
            fmt(res["kiln"]["job_wall_s"], ".1f"),
            fmt(res["max_abs_error"].get("kiln_vs_onnxruntime"), ".2e"),
        ]
        for res in results
    ]
    tuning = table(
        [
            "model",
            "trials done",
            "tasks",
            "MFLOP (Kiln est.)",
            "tuning s",
            "whole job s",
            "max abs err Kiln vs ORT",
        ],
        tuning_rows,
    )
    return timing + "\n\n" + tuning


def main() -> None:
    """Parse arguments, run every model, print the tables and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="small_cnn,mlp", help="comma-separated names in examples/")
    parser.add_argument(
        "--trials", type=int, default=None, help="Kiln trials per model (default 300; 8 with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: 8 trials, few timed calls")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    trials = args.trials if args.trials is not None else (8 if args.quick else 300)
    reps = reps_for(args.quick, None)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    missing = [n for n in names if not (EXAMPLES / f"{n}.onnx").is_file()]
    if missing:
        parser.error(f"no examples/{missing[0]}.onnx")

    run_stamp, work, mach = start_run("model")
    print(
        f"timing: median of {reps.calls} calls after {reps.warmup} warmups, each implementation in its own process"
    )

    results = [bench_model(n, trials, reps, work, args.seed) for n in names]

    print()
    for res in results:
        print(manifest_line(res["model"], res["kiln"]["manifest"]))
    print(f"at the end: {load_line()}")
    print()
    print(report(results, trials))
    print()
    print("peer ms / Kiln ms > 1: Kiln is that many times faster.")
    payload = {
        "script": "model",
        "command": command_line(),
        "stamp": run_stamp,
        "trials": trials,
        "reps": vars(reps),
        "machine": mach,
        "load_average_end": os.getloadavg(),
        "results": results,
    }
    print(f"raw results: {write_json('model', run_stamp, payload)}")


if __name__ == "__main__":
    main()
