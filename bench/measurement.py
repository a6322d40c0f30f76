"""Measurement settings: what a candidate's measurement costs and how repeatable its figure is.

    .venv/bin/python bench/measurement.py RECORDS_DIR [--top 3] [--repeats 5]

RECORDS_DIR holds a MetaSchedule JSON database (``workloads.json``, ``records.json``), e.g. a configuration's
directory of a ``bench/search.py`` run. The ``top`` best records of each task are rebuilt, then measured
``repeats`` times with each evaluator setting below, the settings interleaved, one candidate at a time on
an idle CPU, as Kiln's runner measures. Printed per setting: the runner's wall time per candidate and the
spread of a candidate's figure over the repeats ((max - min) / median, its median and worst over the
candidates), i.e. how far one measurement can be from the next one of the same kernel.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _report import fmt, load_line, start_run, table

# name -> (number, repeat, min_repeat_ms, calibrated): TVM's evaluator, or Kiln's calibrated one
# (tuner.metaschedule.runner.run_calibrated_evaluator)
SETTINGS: dict[str, tuple[int, int, int, bool]] = {
    "stock: 3 runs >= 100 ms, 1 repeat": (3, 1, 100, False),
    "kiln before: 3 runs >= 50 ms, 1 repeat": (3, 1, 50, False),
    "TVM evaluator, 3 repeats >= 10 ms": (1, 3, 10, False),
    "calibrated, 1 repeat of 50 ms": (1, 1, 50, True),
    "calibrated, 3 repeats of 10 ms": (1, 3, 10, True),
    "calibrated, 2 repeats of 10 ms": (1, 2, 10, True),
}


def candidates(records_dir: Path, top: int) -> list[tuple[str, Any]]:
    """The ``top`` best records of each workload, scheduled: (task label, scheduled module)."""
    from kiln_tvm import ms, s_tir, structural_hash

    db = ms.database.JSONDatabase(
        path_workload=str(records_dir / "workloads.json"),
        path_tuning_record=str(records_dir / "records.json"),
        allow_missing=False,
    )
    by_workload: dict[str, list[Any]] = {}
    for rec in db.get_all_tuning_records():
        if rec.run_secs:
            by_workload.setdefault(structural_hash(rec.workload.mod), []).append(rec)
    out = []
    for index, (_, recs) in enumerate(sorted(by_workload.items())):
        recs.sort(key=lambda r: statistics.mean(float(s) for s in r.run_secs))
        for rank, rec in enumerate(recs[:top]):
            sch = s_tir.Schedule(rec.workload.mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
            out.append((f"task{index}#{rank}", sch.mod))
    return out


def main() -> None:
    """Rebuild, measure with every setting, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records_dir", type=Path)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    start_run("measurement")

    from kiln_tvm import Target, ms
    from tuner.metaschedule.builder import PooledBuilder
    from tuner.metaschedule.runner import alloc_measure_arguments, run_calibrated_evaluator
    from tuner.targets import resolve_target, to_tvm_target

    target: Target = to_tvm_target(resolve_target("host"))
    cands = candidates(args.records_dir, args.top)
    builder = PooledBuilder(max_workers=2)
    built = builder.build([ms.builder.BuilderInput(mod, target) for _, mod in cands])
    builder.shutdown()
    inputs = [
        ms.runner.RunnerInput(b.artifact_path, "cpu", ms.arg_info.ArgInfo.from_entry_func(mod, True))
        for (_, mod), b in zip(cands, built, strict=True)
        if b.error_msg is None
    ]
    print(
        f"{len(inputs)} candidates ({len(cands) - len(inputs)} failed to build), {args.repeats} repeats each"
    )
    runners = {
        name: ms.runner.LocalRunner(
            evaluator_config=ms.runner.EvaluatorConfig(
                number=n, repeat=r, min_repeat_ms=m, enable_cpu_cache_flush=False
            ),
            f_alloc_argument=alloc_measure_arguments,
            f_run_evaluator=run_calibrated_evaluator if calibrated else None,
        )
        for name, (n, r, m, calibrated) in SETTINGS.items()
    }
    figures: dict[str, list[list[float]]] = {name: [[] for _ in inputs] for name in SETTINGS}
    wall: dict[str, float] = dict.fromkeys(SETTINGS, 0.0)
    errors: dict[str, str] = {}
    for _ in range(args.repeats):
        for i, item in enumerate(inputs):
            for name, runner in runners.items():
                start = time.perf_counter()
                (result,) = [f.result() for f in runner.run([item])]
                wall[name] += time.perf_counter() - start
                if result.error_msg is None:
                    figures[name][i].append(statistics.mean(float(s) for s in result.run_secs))
                else:
                    errors[name] = str(result.error_msg).strip().splitlines()[-1][:300]
        print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    for name, err in errors.items():
        print(f"{name}: some measurements failed, e.g. {err}")
    rows = []
    for name in SETTINGS:
        spreads = [(max(f) - min(f)) / statistics.median(f) for f in figures[name] if len(f) > 1] or [
            math.nan
        ]
        rows.append(
            [
                name,
                fmt(wall[name] / (len(inputs) * args.repeats) * 1e3, ".1f"),
                fmt(statistics.median(spreads) * 100, ".1f"),
                fmt(max(spreads) * 100, ".1f"),
            ]
        )
    print(load_line())
    print(table(["setting", "ms per candidate", "median spread %", "worst spread %"], rows))


if __name__ == "__main__":
    main()
