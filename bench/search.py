"""Tuning throughput: Kiln's search against MetaSchedule's stock settings, on the same tasks of one model.

    .venv/bin/python bench/search.py [--model bert] [--trials 1000] [--configs stock,kiln] [--rounds 5]

The model (bench/_full_models.py) is exported to ONNX and planned once by Kiln (the same graph passes and
tasks for every configuration). Each configuration then tunes those tasks cold, for the same number of
trials, in a fresh process of its own, into a fresh JSON database, and compiles the model with its records:

* ``stock``: what ``tvm.s_tir.meta_schedule.relax_integration.tune_relax`` does with its defaults (the
  target's default space, evolutionary search with a population of 512, 64 candidates per round,
  ``LocalBuilder``, ``LocalRunner`` with 3 runs of at least 100 ms, XGBoost, the gradient task scheduler);
* ``stock-fast-build``: the same, but candidates are built without importing every tensor intrinsic in
  each new builder worker (stock's ``default_build`` does, ~26 s here, for every batch, as LocalBuilder
  starts new workers per batch): stock's search and measurement without that trap of TVM 0.27;
* ``kiln``: ``tuner.tune.tune_tasks`` with Kiln's defaults (``MeasureConfig()``), as a Kiln job runs it.

Each compiled model is then timed in interleaved rounds, each time in a fresh process (bench/_timing.py),
with its outputs checked against the first configuration's. Printed per configuration: trials measured,
tuning seconds, trials per minute and its ratio to the first stock configuration given, end-to-end latency
and its ratio, and where the tuning time went (MetaSchedule's profiler). ``kiln-*`` configurations are
ablations: each puts one of Kiln's levers back to what it was before.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _full_models import MODELS, export
from _report import command_line, fmt, load_line, start_run, table, write_json
from _timing import Reps, interleaved, save_inputs, time_in_fresh_process

# Kiln's configurations: MeasureConfig fields changed from Kiln's defaults. Each ablation puts one lever
# back to what Kiln did before it (bench/RESULTS.md says what each lever is worth).
KILN_CONFIGS: dict[str, dict[str, Any]] = {
    "kiln": {},
    "kiln-population-256": {"population_size": 256},
    "kiln-no-default-schedules": {"default_schedules": False},
    "kiln-measure-before": {"number": 3, "repeat": 1, "min_repeat_ms": 50, "calibrate": False},
}
STOCK_CONFIGS = ("stock", "stock-fast-build")
CONFIGS = (*STOCK_CONFIGS, *KILN_CONFIGS)


# --------------------------------------------------------------------------------------------------
# The child: tune one configuration


def _tune_stock(
    config: str, tasks: list[Any], target: Any, database: Any, trials: int, work_dir: Path, seed: int
) -> dict[str, float]:
    from kiln_tvm import build_candidate, ms

    # Stock's builder function imports all of tvm.s_tir.tensor_intrin (~26 s here) in every new worker,
    # and LocalBuilder starts new workers for every batch; "stock-fast-build" builds without that import.
    builder = ms.builder.LocalBuilder(f_build=build_candidate) if config == "stock-fast-build" else "local"

    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, str(work_dir), seed=seed)
    ms.tune_tasks(
        tasks=contexts,
        task_weights=weights,
        work_dir=str(work_dir),
        max_trials_global=trials,
        num_trials_per_iter=64,
        builder=builder,
        runner="local",
        database=database,
        cost_model="xgb",
        measure_callbacks="default",
        task_scheduler="gradient",
    )
    return {}


def _tune_kiln(
    config: str, tasks: list[Any], target: Any, database: Any, trials: int, work_dir: Path, seed: int
) -> dict[str, float]:
    from tuner.entities import Budget
    from tuner.tune import MeasureConfig, tune_tasks

    measure = MeasureConfig(**KILN_CONFIGS[config])
    budget = Budget(trials=trials, seed=seed)
    return tune_tasks(tasks, target, database, budget=budget, config=measure, work_dir=work_dir).profile


def child(config: str, onnx_path: Path, trials: int, out: Path, seed: int, fast_math: bool) -> None:
    """Plan, tune with ``config`` and compile; write ``result.json`` and ``model.so`` into ``out``."""
    from kiln_tvm import ms
    from tuner.compile import build_tuned
    from tuner.entities import PlanningOptions
    from tuner.frontend import load_model
    from tuner.passes.plan import plan_graph
    from tuner.targets import resolve_target, to_tvm_target

    out.mkdir(parents=True, exist_ok=True)
    target = to_tvm_target(resolve_target("host"))
    plan = plan_graph(load_model(onnx_path).mod, target, PlanningOptions(fast_math=fast_math))
    database = ms.database.JSONDatabase(
        path_workload=str(out / "workloads.json"), path_tuning_record=str(out / "records.json")
    )
    profiler = ms.Profiler()
    start = time.perf_counter()
    with profiler:  # stock's phases land here; Kiln's tune_tasks profiles itself and returns its figures
        if config in STOCK_CONFIGS:
            profile = _tune_stock(config, plan.tasks, target, database, trials, out / "work", seed)
        else:
            profile = _tune_kiln(config, plan.tasks, target, database, trials, out / "work", seed)
    tuning_s = time.perf_counter() - start
    records = database.get_all_tuning_records()
    best: dict[str, float] = {}
    for info, task in zip(plan.infos, plan.tasks, strict=True):
        top = database.get_top_k(database.commit_workload(task.dispatched[0]), 1)
        if top and top[0].run_secs:
            best[info.name] = sum(float(s) for s in top[0].run_secs) / len(top[0].run_secs) * 1e6
    build_tuned(plan, target, database).export_library(str(out / "model.so"))
    result = {
        "config": config,
        "tasks": len(plan.tasks),
        "trials": len(records),
        "tuning_s": tuning_s,
        "best_us": best,
        "sum_ms": sum(best[i.name] * i.weight for i in plan.infos if i.name in best) / 1e3,
        "profile": profile or {k: float(v) for k, v in profiler.get().items()},
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))


# --------------------------------------------------------------------------------------------------
# The parent


def run_config(
    config: str, onnx_path: Path, trials: int, out: Path, seed: int, fast_math: bool
) -> dict[str, Any]:
    """Tune and compile ``config`` in a fresh process; return its ``result.json``."""
    cmd = [sys.executable, __file__, "--child", config, "--onnx", str(onnx_path), "--trials", str(trials)]
    cmd += ["--out", str(out), "--seed", str(seed), *([] if fast_math else ["--exact-math"])]
    print(f"  [{config}] tuning {trials} trials", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (out / "log.txt").parent.mkdir(parents=True, exist_ok=True)
    (out / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
        raise RuntimeError(f"{config} failed (exit {proc.returncode}):\n{tail}")
    return json.loads((out / "result.json").read_text())


def report(results: dict[str, dict[str, Any]], runs: dict[str, dict[str, Any]]) -> str:
    """The comparison table (ratios against each stock configuration run) and where the time went."""
    bases = [c for c in STOCK_CONFIGS if c in results] or [next(iter(results))]

    def rate(name: str) -> float:
        return results[name]["trials"] / results[name]["tuning_s"] * 60

    rows = []
    for name, res in results.items():
        rounds = runs[name]["round_ms"]
        rows.append(
            [
                name,
                res["tasks"],
                res["trials"],
                fmt(res["tuning_s"], ".0f"),
                fmt(rate(name), ".1f"),
                *(fmt(rate(name) / rate(b), ".2f") for b in bases),
                fmt(res["sum_ms"]),
                fmt(runs[name]["ms"]),
                f"{fmt(min(rounds))}-{fmt(max(rounds))}",
                *(fmt(runs[b]["ms"] / runs[name]["ms"], ".2f") for b in bases),
            ]
        )
    headers = ["config", "tasks", "trials", "tuning s", "trials/min"]
    headers += [f"trials/min vs {b}" for b in bases]
    headers += ["Σ kernels ms", "e2e ms", "rounds ms"]
    headers += [f"{b} ms / this ms" for b in bases]
    main_table = table(headers, rows)
    first = results[bases[0]]["profile"]
    keys = sorted({k for r in results.values() for k in r["profile"]}, key=lambda k: -first.get(k, 0.0))
    prof_rows = [
        [k, *(fmt(r["profile"].get(k, 0.0) / max(1, r["trials"]) * 1e3, ".1f") for r in results.values())]
        for k in keys
        if any(r["profile"].get(k, 0.0) > 0.005 * r["tuning_s"] for r in results.values())
    ]
    return main_table + "\n\n" + table(["ms per trial", *results], prof_rows)


def main() -> None:
    """Parse arguments; run the child or the whole comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert", choices=MODELS)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--reuse",
        type=Path,
        help="the work directory of an earlier run on this machine: configurations tuned there are not "
        "tuned again (their compiled models are still timed in this run's rounds)",
    )
    parser.add_argument(
        "--exact-math",
        action="store_true",
        help="plan the tasks without fast math (exact exp/erf/softmax; Kiln's KILN_FAST_MATH=false)",
    )
    parser.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--onnx", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.onnx, args.trials, args.out, args.seed, not args.exact_math)
        return
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            parser.error(f"unknown config {c!r}; known: {', '.join(CONFIGS)}")

    run_stamp, work, mach = start_run("search")
    print(f"model {args.model}, {args.trials} trials per configuration, cold, each in a fresh process")
    onnx_path, _ = export(args.model, work / "models", args.seed)
    results = {}
    for c in configs:
        earlier = args.reuse / c if args.reuse else None
        if earlier is not None and (earlier / "result.json").exists():
            print(f"  [{c}] reusing {earlier}", file=sys.stderr, flush=True)
            shutil.copytree(earlier, work / c, ignore=shutil.ignore_patterns("timing"))
            results[c] = json.loads((work / c / "result.json").read_text())
            results[c]["reused_from"] = str(earlier)
        else:
            results[c] = run_config(c, onnx_path, args.trials, work / c, args.seed, not args.exact_math)

    from tuner.compile import random_inputs
    from tuner.frontend import load_model

    imported = load_model(onnx_path)
    names = [t.name for t in imported.signature.inputs]
    npz = save_inputs(
        work / "inputs.npz", dict(zip(names, random_inputs(imported.signature, 0), strict=True))
    )
    reps = Reps(budget_s=10.0, rounds=args.rounds)
    first = configs[0]
    reference = work / first / "timing" / "outputs.npz"
    timers = {
        c: (
            lambda c=c: time_in_fresh_process(
                "tvm",
                work / c / "model.so",
                npz,
                reps,
                reference_npz=None if c == first else reference,
                tolerance=1e-3,
                out_dir=work / c / "timing",
            )
        )
        for c in configs
    }
    runs = interleaved(timers, reps.rounds)
    print(f"at the end: {load_line()}")
    print()
    print(report(results, runs))
    payload = {
        "script": "search",
        "command": command_line(),
        "stamp": run_stamp,
        "machine": mach,
        "model": args.model,
        "trials": args.trials,
        "results": results,
        "runs": runs,
    }
    print(f"raw results: {write_json('search', run_stamp, payload)}")


if __name__ == "__main__":
    main()
