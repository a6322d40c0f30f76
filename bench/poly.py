"""The polyhedral space against the stock one: how many trials each needs to reach a kernel's best.

    .venv/bin/python bench/poly.py [--kernels matmul,conv3x3,depthwise,softmax,layernorm]
                                   [--trials 1000] [--seeds 3] [--spaces cpu,cpu-poly]
    .venv/bin/python bench/poly.py --report bench/work/poly-STAMP --trials 1000   # an interrupted run
    .venv/bin/python bench/poly.py --resume bench/work/poly-STAMP --trials 1000   # finish it

Each kernel is the TIR Kiln's legalization gives it (a 512^3 matmul; a ResNet-style 3x3 convolution,
NHWC 1x56x56x64 -> 64 channels with padding 1; a 3x3 depthwise convolution on the same input; a softmax
over 4x128x128 attention scores; a layer norm over 128x768). Each (kernel, seed, space) is tuned cold by
``tuner.tune.tune_tasks`` as a Kiln job tunes a task (rounds of 16, XGBoost, the same runner), without the
default-schedule rules so that only the spaces differ, in a fresh process of its own, the spaces
alternating within each seed. Every trial's measured latency is kept in order.

Printed per kernel: each space's best (median over the seeds) after 64, 200 and the full trials; the
reference, the stock space's best after the full trials (median over the seeds); the trials each space
needs to get within 10 % of it (median over the seeds; "> N" when a seed never did); and cpu-poly's
candidates rejected, passed through and seeds. The goal (issue 11): cpu-poly needs at most half the
trials on the geometric mean over the kernels, and is never worse by more than the noise at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _report import fmt, load_line, start_run, table, write_json

KERNELS = ("matmul", "conv3x3", "depthwise", "softmax", "layernorm")
CHECKPOINTS = (64, 200)
WITHIN = 1.10


def build_kernel(name: str) -> Any:
    """The unscheduled PrimFunc of one benchmark kernel, as an IRModule."""
    from kiln_tvm import tvm

    te, topi = tvm.te, tvm.topi
    if name == "matmul":
        a = te.placeholder((512, 512), name="A")
        b = te.placeholder((512, 512), name="B")
        k = te.reduce_axis((0, 512), name="k")
        c = te.compute((512, 512), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="matmul")
        args = [a, b, c]
    elif name == "conv3x3":
        x = te.placeholder((1, 56, 56, 64), name="x")
        w = te.placeholder((3, 3, 64, 64), name="w")
        args = [x, w, topi.nn.conv2d_nhwc(x, w, 1, 1, 1)]
    elif name == "depthwise":
        x = te.placeholder((1, 56, 56, 64), name="x")
        w = te.placeholder((3, 3, 64, 1), name="w")
        args = [x, w, topi.nn.depthwise_conv2d_nhwc(x, w, 1, 1, 1)]
    elif name == "softmax":
        x = te.placeholder((4, 128, 128), name="x")
        args = [x, topi.nn.softmax(x, axis=-1)]
    elif name == "layernorm":
        x = te.placeholder((128, 768), name="x")
        gamma = te.placeholder((768,), name="gamma")
        beta = te.placeholder((768,), name="beta")
        args = [x, gamma, beta, topi.nn.layer_norm(x, gamma, beta, axis=[-1], epsilon=1e-5)]
    else:
        raise SystemExit(f"unknown kernel {name!r}; known: {', '.join(KERNELS)}")
    return tvm.IRModule({"main": te.create_prim_func(args)})


# --------------------------------------------------------------------------------------------------
# The child: tune one kernel in one space with one seed


class _Task:
    def __init__(self, name: str, mod: Any) -> None:
        self.task_name, self.dispatched, self.weight = name, [mod], 1


def child(kernel: str, space: str, seed: int, trials: int, out: Path) -> None:
    from kiln_tvm import ms
    from schedules.poly.caches import host_caches
    from schedules.spaces import SpaceOptions
    from tuner.entities import Budget
    from tuner.metaschedule.callback import TrialBatch
    from tuner.targets import host_target, to_tvm_target
    from tuner.tune import MeasureConfig, tune_tasks

    target = to_tvm_target(host_target())
    curve: list[float | None] = []

    def on_batch(batch: TrialBatch) -> None:
        curve.extend(batch.latencies_us)

    config = MeasureConfig(
        default_schedules=False, space=space, space_options=SpaceOptions(caches=host_caches())
    )
    started = time.perf_counter()
    report = tune_tasks(
        [_Task(kernel, build_kernel(kernel))],
        target,
        ms.database.MemoryDatabase(),
        budget=Budget(trials=trials, seed=seed),
        config=config,
        work_dir=out.parent / f"{out.stem}-ms",
        on_batch=on_batch,
    )
    out.write_text(
        json.dumps(
            {
                "curve": curve,
                "seconds": time.perf_counter() - started,
                "stats": report.search_stats.get(0),
            }
        )
    )


# --------------------------------------------------------------------------------------------------
# The parent


def best_after(curve: list[float | None], trials: int) -> float | None:
    valid = [c for c in curve[:trials] if c is not None]
    return min(valid) if valid else None


def trials_to_reach(curve: list[float | None], goal: float) -> int | None:
    best = math.inf
    for index, latency in enumerate(curve, start=1):
        if latency is not None:
            best = min(best, latency)
        if best <= goal:
            return index
    return None


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kernels", default=",".join(KERNELS))
    parser.add_argument("--spaces", default="cpu,cpu-poly")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--report",
        metavar="WORK_DIR",
        help="Only report a run's finished tunings (per kernel, its complete seeds)",
    )
    parser.add_argument(
        "--resume",
        metavar="WORK_DIR",
        help="Finish an interrupted run: tune only the (kernel, space, seed) it has no result for",
    )
    parser.add_argument("--child", nargs=5, metavar=("KERNEL", "SPACE", "SEED", "TRIALS", "OUT"))
    args = parser.parse_args()
    if args.child:
        kernel, space, seed, trials, out = args.child
        child(kernel, space, int(seed), int(trials), Path(out))
        return

    kernels, spaces = args.kernels.split(","), args.spaces.split(",")
    if args.report:
        # An interrupted run: per kernel, the seeds that every space finished.
        work = Path(args.report)
        run_stamp, machine = work.name.removeprefix("poly-") + "-report", {}
        runs = {k: {s: [] for s in spaces} for k in kernels}
        for kernel in kernels:
            for seed in range(args.seeds):  # the seeds of this kernel that every space finished
                files = {s: work / f"{kernel}-{s}-{seed}.json" for s in spaces}
                if all(f.exists() for f in files.values()):
                    for space, f in files.items():
                        runs[kernel][space].append(json.loads(f.read_text()))
        counts = ", ".join(f"{k} {len(runs[k][spaces[0]])}" for k in kernels)
        print(f"report of {work}: seeds finished by every space: {counts}")
    else:
        run_stamp, work, machine = start_run("poly")
        if args.resume:
            work = Path(args.resume)
            print(f"resuming {work}: its finished tunings are kept, the others run now")
        work.mkdir(parents=True, exist_ok=True)
        runs = {k: {s: [] for s in spaces} for k in kernels}
        # Seed by seed over all kernels, so that an interrupted run still covers every kernel.
        for seed in range(args.seeds):
            for kernel in kernels:
                for space in spaces if seed % 2 == 0 else list(reversed(spaces)):
                    out = work / f"{kernel}-{space}-{seed}.json"
                    if out.exists():  # finished before a --resume
                        runs[kernel][space].append(json.loads(out.read_text()))
                        continue
                    cmd = [
                        sys.executable,
                        __file__,
                        "--child",
                        kernel,
                        space,
                        str(seed),
                        str(args.trials),
                        str(out),
                    ]
                    subprocess.run(cmd, check=True)
                    result = json.loads(out.read_text())
                    runs[kernel][space].append(result)
                    print(
                        f"{kernel} {space} seed {seed}: best {fmt(best_after(result['curve'], args.trials))} us "
                        f"after {len(result['curve'])} trials in {result['seconds']:.0f} s; {result['stats']}",
                        flush=True,
                    )

    stock = spaces[0]
    headers = ["kernel", "space", *[f"best @{c} (us)" for c in CHECKPOINTS], f"best @{args.trials} (us)"]
    headers += [f"trials to {WITHIN:.2f}x stock's best @{args.trials}", "rejected / examined", "seeds"]
    rows, ratios = [], []
    for kernel in kernels:
        reference = _median([best_after(r["curve"], args.trials) for r in runs[kernel][stock]])
        needed: dict[str, float] = {}
        for space in spaces:
            results = runs[kernel][space]
            reach = [trials_to_reach(r["curve"], WITHIN * reference) if reference else None for r in results]
            # A seed that never got there counts as needing more than the budget.
            counted = [n if n is not None else args.trials + 1 for n in reach]
            needed[space] = statistics.median(counted)
            stats = [r["stats"] for r in results if r["stats"]]
            rows.append(
                [
                    kernel,
                    space,
                    *[fmt(_median([best_after(r["curve"], c) for r in results]), ".1f") for c in CHECKPOINTS],
                    fmt(_median([best_after(r["curve"], args.trials) for r in results]), ".1f"),
                    ", ".join(str(n) if n is not None else f"> {args.trials}" for n in reach)
                    + f" (median {needed[space]:g})",
                    f"{sum(s['rejected'] for s in stats)} / {sum(s['examined'] for s in stats)}"
                    if stats
                    else "",
                    ", ".join(str(s["seeds"]) for s in stats) if stats else "",
                ]
            )
        if len(spaces) > 1:
            ratios.append(needed[spaces[1]] / needed[stock])
    print()
    print(table(headers, rows))
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(
            f"\n{spaces[1]} / {stock} trials to reach {WITHIN:.2f}x the stock best @{args.trials}, per kernel: "
            + ", ".join(f"{k} {r:.2f}" for k, r in zip(kernels, ratios, strict=True))
            + f"; geometric mean {geomean:.2f} (goal <= 0.50)"
        )
    print(load_line())
    write_json("poly", run_stamp, {"machine": machine, "trials": args.trials, "runs": runs})


if __name__ == "__main__":
    main()
