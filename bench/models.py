"""Full-size models tuned cold by Kiln within a time budget, side by side with onnxruntime, OpenVINO and
PyTorch eager.

    .venv/bin/python bench/models.py [--models resnet18,mobilenetv2,bert] [--time 30m] [--rounds 5] [--quick]

Each model (bench/_full_models.py: ResNet-18, MobileNetV2, a 2-layer BERT-style encoder; seeded random
weights, batch 1) is exported to ONNX and tuned through Kiln's product path with a time budget and no trial
limit, in a fresh store of its own (cold: no records of earlier runs). Then, in interleaved rounds, each
implementation runs in a fresh process on the same seeded inputs (bench/_timing.py): Kiln's artifact,
untuned TVM (plain ``tvm.compile``), onnxruntime (CPU EP), OpenVINO CPU with fp32 inference precision and
with its default precision (bf16 on CPUs with AVX512-BF16 or AMX), and PyTorch eager (the module itself).
Every output is checked against onnxruntime's; bf16 OpenVINO is reported, not failed.

Per model it prints the latencies and ratios, the tuning time and trials, Kiln's end-to-end latency
against the sum over its tasks of weight x best measured kernel latency (where the rest of the time goes),
and its GEMM-like kernels against the fp32 peak measured at the start (bench/kernel_peak.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _full_models import MODELS, export
from _kiln import tune
from _report import (
    chosen_models,
    command_line,
    fmt,
    kernel_sum,
    load_line,
    manifest_line,
    start_run,
    table,
    write_json,
)
from _timing import Reps, interleaved, load_outputs, reps_for, save_inputs, time_in_fresh_process
from kernel_peak import gemm_kernels
from kernel_peak import report as peak_report

from cli.durations import format_duration, parse_duration

PEERS = {  # timing kind -> label
    "untuned": "TVM untuned (tvm.compile)",
    "onnxruntime": "onnxruntime (CPU EP)",
    "openvino-fp32": "OpenVINO CPU, fp32",
    "openvino": "OpenVINO CPU, default precision",
    "torch": "PyTorch eager",
}
TOLERANCE = {"torch": 1e-3, "openvino-fp32": 1e-3, "openvino": math.inf}  # abs, vs onnxruntime


def bench_model(
    name: str, time_s: float, reps: Reps, work: Path, seed: int, precision: str = "as-is"
) -> dict[str, Any]:
    """Export, tune cold (under the ``precision`` policy) and time one model; returns the raw results."""
    onnx_path, weights = export(name, work / "models", seed)
    kiln = tune(onnx_path, work / name / "kiln", None, name, seed, time_s=time_s, precision=precision)
    # A reduced precision is verified by the job, norm-wise (tuner.passes.precision); not element-wise here.
    kiln_tolerance = 1e-3 if precision == "as-is" else math.inf
    npz = save_inputs(work / name / "inputs.npz", kiln.inputs)
    out = work / name
    reference = out / "onnxruntime" / "outputs.npz"
    timers: dict[str, Callable[[], dict[str, Any]]] = {
        "onnxruntime": lambda: time_in_fresh_process(
            "onnxruntime", onnx_path, npz, reps, out_dir=out / "onnxruntime"
        ),
        "kiln": lambda: time_in_fresh_process(
            "tvm",
            kiln.model_so,
            npz,
            reps,
            reference_npz=reference,
            tolerance=kiln_tolerance,
            out_dir=out / "kiln",
        ),
        "untuned": lambda: time_in_fresh_process("tvm", kiln.untuned_so, npz, reps, out_dir=out / "untuned"),
    }
    skipped: dict[str, str] = {}
    if importlib.util.find_spec("openvino"):
        for kind in ("openvino-fp32", "openvino"):
            timers[kind] = lambda kind=kind: time_in_fresh_process(
                kind,
                onnx_path,
                npz,
                reps,
                reference_npz=reference,
                tolerance=TOLERANCE[kind],
                out_dir=out / kind,
            )
    else:
        skipped["openvino"] = "openvino is not installed (make bench installs the bench extra)"
    timers["torch"] = lambda: time_in_fresh_process(
        "torch-module",
        weights,
        npz,
        reps,
        reference_npz=reference,
        tolerance=TOLERANCE["torch"],
        out_dir=out / "torch",
    )
    runs = interleaved(timers, reps.rounds)
    for r in runs.values():
        r["peer_over_kiln"] = r["ms"] / runs["kiln"]["ms"]
    ort = load_outputs(runs["onnxruntime"])
    errors = {key: _max_abs_error(load_outputs(r), ort) for key, r in runs.items() if key != "onnxruntime"}
    return {
        "model": name,
        "precision": precision,
        "runs": runs,
        "skipped": skipped,
        "max_abs_error_vs_onnxruntime": errors,
        "kernels": kernel_sum(kiln.manifest),
        "gemm_kernels": gemm_kernels(work / name / "kiln", kiln.job_id),
        "kiln": {k: v for k, v in vars(kiln).items() if k != "inputs"},
    }


def _max_abs_error(a: list[Any], b: list[Any]) -> float:
    return max(float(abs(x.astype("float64") - y).max()) for x, y in zip(a, b, strict=True))


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def report(results: list[dict[str, Any]], time_s: float) -> str:
    """The markdown tables for RESULTS.md: latencies per model, then the summary with ratios."""
    rows = []
    for res in results:
        for key, r in res["runs"].items():
            precision = res.get("precision", "as-is")
            budget = f"{format_duration(time_s)} budget" + ("" if precision == "as-is" else f", {precision}")
            label = f"Kiln ({budget})" if key == "kiln" else PEERS[key]
            if key == "openvino":
                label += f" ({r['runtime'].get('inference_precision', '?')})"
            rounds = r.get("round_ms", [])
            rows.append(
                [
                    res["model"],
                    label,
                    fmt(r["ms"]),
                    f"{fmt(min(rounds))}-{fmt(max(rounds))}" if rounds else "",
                    "1.00" if key == "kiln" else fmt(r["peer_over_kiln"], ".2f"),
                    fmt(res["max_abs_error_vs_onnxruntime"].get(key), ".1e"),
                ]
            )
        for key, why in res["skipped"].items():
            rows.append([res["model"], key, f"skipped: {why}", "", "", ""])
    timing = table(
        ["model", "implementation", "median ms", "rounds ms", "peer ms / Kiln ms", "max abs err vs ORT"], rows
    )
    summary_rows, ratios = [], {k: [] for k in ("onnxruntime", "openvino-fp32", "openvino", "torch")}
    for res in results:
        kiln, runs, kernels = res["kiln"], res["runs"], res["kernels"]
        e2e = runs["kiln"]["ms"]
        for key in ratios:
            if key in runs:
                ratios[key].append(runs[key]["peer_over_kiln"])
        summary_rows.append(
            [
                res["model"],
                kiln["tasks"],
                kiln["trials_done"],
                fmt(kiln["stage_s"].get("tuning"), ".0f"),
                fmt(kernels["sum_ms"]),
                fmt(e2e),
                # Only meaningful when every task has a measured kernel.
                fmt(e2e / kernels["sum_ms"], ".2f")
                if kernels["sum_ms"] and not kernels["unmeasured"]
                else "n/a",
                len(kernels["unmeasured"]),
                *(fmt(runs[k]["peer_over_kiln"], ".2f") if k in runs else "n/a" for k in ratios),
            ]
        )
    summary_rows.append(
        [
            "**geometric mean**",
            "",
            "",
            "",
            "",
            "",
            "",
            "",
            *(fmt(_geomean(v), ".2f") for v in ratios.values()),
        ]
    )
    summary = table(
        [
            "model",
            "tasks",
            "trials",
            "tuning s",
            "Σ kernels ms",
            "Kiln e2e ms",
            "e2e / Σ",
            "tasks unmeasured",
            "ORT / Kiln",
            "OV fp32 / Kiln",
            "OV default / Kiln",
            "PyTorch / Kiln",
        ],
        summary_rows,
    )
    return timing + "\n\n" + summary


def main() -> None:
    """Parse arguments, run every model, print the tables and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument(
        "--time", default=None, help="Kiln's tuning budget per model (default 30m; 20s with --quick)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="smoke test: a short budget, one round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--precision",
        default="as-is",
        choices=["as-is", "auto", "bf16", "fp16"],
        help="Kiln's precision policy for float matmuls and convolutions (compare bf16 with OpenVINO's default)",
    )
    args = parser.parse_args()
    time_s = parse_duration(args.time or ("20s" if args.quick else "30m"))
    reps = reps_for(args.quick, args.rounds, Reps(budget_s=10.0))
    names = chosen_models(parser, args.models, MODELS)
    # Kiln's job times its own side-by-side figures too; here the benchmark's rounds are the ones reported.
    os.environ.setdefault("KILN_LATENCY_ROUNDS", "1")

    run_stamp, work, mach = start_run("models")
    print(
        f"Kiln: tuned cold with a {format_duration(time_s)} budget per model (no trial limit), "
        f"precision {args.precision}"
    )
    print(f"timing: {reps.rounds} interleaved rounds, each implementation in a fresh process per round")

    results = []
    for name in names:
        results.append(bench_model(name, time_s, reps, work, args.seed, args.precision))
        # Partial results survive a run cut short.
        write_json("models", run_stamp, {"partial": True, "results": results, "machine": mach})

    print()
    for res in results:
        print(manifest_line(res["model"], res["kiln"]["manifest"]))
    print(f"at the end: {load_line()}")
    print()
    print(report(results, time_s))
    print()
    print("peer ms / Kiln ms > 1: Kiln is that many times faster. e2e / Σ: Kiln's end-to-end latency over")
    print(
        "the sum of weight x best kernel latency measured while tuning (1.00: no time outside the kernels)."
    )
    print()
    print(f"GEMM-like kernels against the measured fp32 peak, {mach['peak_gflops']:.1f} GFLOP/s:")
    print(peak_report({res["model"]: res["gemm_kernels"] for res in results}, mach["peak_gflops"]))
    payload = {
        "script": "models",
        "command": command_line(),
        "stamp": run_stamp,
        "time_s": time_s,
        "precision": args.precision,
        "reps": vars(reps),
        "machine": mach,
        "load_average_end": os.getloadavg(),
        "results": results,
    }
    print(f"raw results: {write_json('models', run_stamp, payload)}")


if __name__ == "__main__":
    main()
