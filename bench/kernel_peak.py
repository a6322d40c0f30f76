"""GEMM-like kernels against this machine's measured fp32 peak, from the job stores of a bench/models.py run.

Every tuned matmul, dense or convolution deep enough to be compute-bound (``schedules.anatomy``) is
listed with its best GFLOP/s and its share of the peak ``kiln machine`` measures; the summary says how
many reach 85 % and what share of the GEMM time runs at which fraction.

    .venv/bin/python bench/kernel_peak.py bench/work/models-<stamp>.json [--peak GFLOPS]

bench/models.py calls :func:`gemm_kernels` itself at the end of a run; this script reads an earlier run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from _report import fmt, table

#: The issue's bar for a tuned GEMM-like kernel.
GOAL_FRACTION = 0.85


def gemm_kernels(data_dir: Path, job_id: str) -> list[dict[str, Any]]:
    """The GEMM-like tasks of ``job_id`` in the store under ``data_dir``: name, weight, contraction depth,
    FLOP per byte of arguments, MFLOP, best µs and GFLOP/s."""
    from kiln_tvm import tvm
    from schedules.anatomy import arithmetic_intensity, contraction_depth, is_gemm_like
    from tuner.settings import Settings
    from tuner.store.sql import Store

    store = Store.from_settings(Settings(data_dir=data_dir, database_url=None))
    kernels = []
    for task in store.list_tasks(job_id):
        func = tvm.script.from_source(store.get_workload_script(task.workload_id))["main"]
        if not is_gemm_like(func):
            continue
        kernels.append(
            {
                "task": task.name,
                "weight": task.weight,
                "depth": contraction_depth(func),
                "flop_per_byte": arithmetic_intensity(func),
                "mflop": task.flops / 1e6,
                "best_us": task.best_latency_us,
                "gflops": task.gflops,
            }
        )
    return kernels


def summary(kernels: list[dict[str, Any]], peak_gflops: float) -> dict[str, Any]:
    """How many GEMM-like kernels reach the goal, and the time-weighted fraction of the peak."""
    measured = [k for k in kernels if k["gflops"]]
    time_us = sum(k["weight"] * k["best_us"] for k in measured)
    flop = sum(k["weight"] * k["mflop"] * 1e6 for k in measured)
    return {
        "kernels": len(kernels),
        "measured": len(measured),
        "at_goal": sum(1 for k in measured if k["gflops"] >= GOAL_FRACTION * peak_gflops),
        # FLOP over time: what the GEMM part of the model achieves as a whole.
        "weighted_fraction": flop / (time_us * 1e-6) / 1e9 / peak_gflops if time_us else None,
        "min_fraction": min((k["gflops"] / peak_gflops for k in measured), default=None),
    }


def report(per_model: dict[str, list[dict[str, Any]]], peak_gflops: float) -> str:
    """Markdown: the summary per model, then every GEMM-like kernel slower than the goal."""
    rows, slow = [], []
    for model, kernels in per_model.items():
        s = summary(kernels, peak_gflops)
        rows.append(
            [
                model,
                s["kernels"],
                f"{s['at_goal']}/{s['measured']}",
                fmt(100 * s["weighted_fraction"] if s["weighted_fraction"] else None, ".0f"),
                fmt(100 * s["min_fraction"] if s["min_fraction"] else None, ".0f"),
            ]
        )
        for k in sorted(kernels, key=lambda k: k["gflops"] or 0):
            if k["gflops"] and k["gflops"] < GOAL_FRACTION * peak_gflops:
                slow.append(
                    [
                        model,
                        k["task"],
                        k["weight"],
                        k["depth"],
                        fmt(k.get("flop_per_byte"), ".1f"),
                        fmt(k["mflop"], ".1f"),
                        fmt(k["best_us"], ".1f"),
                        fmt(k["gflops"], ".0f"),
                        fmt(100 * k["gflops"] / peak_gflops, ".0f"),
                    ]
                )
    head = table(
        [
            "model",
            "GEMM-like tasks",
            f"≥ {GOAL_FRACTION:.0%} of peak",
            "% of peak, all (FLOP / time)",
            "lowest %",
        ],
        rows,
    )
    below = table(
        [
            "model",
            "task below the goal",
            "weight",
            "depth",
            "FLOP/byte",
            "MFLOP",
            "best µs",
            "GFLOP/s",
            "% of peak",
        ],
        slow,
    )
    return f"{head}\n\n{below}" if slow else head


def main() -> None:
    """Read a bench/models.py run's JSON, list its GEMM-like kernels against the measured peak."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="bench/work/models-<stamp>.json")
    parser.add_argument(
        "--peak", type=float, default=None, help="fp32 peak, GFLOP/s (default: measure it now)"
    )
    args = parser.parse_args()
    run = json.loads(args.run.read_text())
    peak = args.peak
    if peak is None:
        from tuner.targets import host_target
        from tuner.timing.roofline import measure_limits

        peak = measure_limits(host_target()).peak_gflops
    work = args.run.with_suffix("")
    per_model = {
        res["model"]: gemm_kernels(work / res["model"] / "kiln", res["kiln"]["job_id"])
        for res in run["results"]
    }
    print(f"fp32 peak: {peak:.1f} GFLOP/s (measured with `kiln machine` unless given)")
    print(report(per_model, peak))


if __name__ == "__main__":
    main()
