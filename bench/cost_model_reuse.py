"""What a cost model trained on the store buys: trials to a given latency on held-out models' heaviest
kernels, tuned with MetaSchedule's untrained XGBoost model (cold) and with the model Kiln trains on the
records of *other* models (pretrained), nothing else differing.

    .venv/bin/python bench/cost_model_reuse.py --from bench/work/time_to_fast-STAMP
                                               [--models resnet18,...] [--tasks 2] [--trials 64]

It reads a ``bench/time_to_fast.py`` run's cold stores (every record each model's cold job measured) and
its ONNX exports. For each held-out model:

* a training store gets the records of every *other* model (as the warm run's store does), and
  ``tuner.metaschedule.cost_model.load_cost_model`` trains the XGBoost model on them, as a job's start does;
* the model's ``--tasks`` heaviest tasks (calls x FLOPs) are each tuned for ``--trials`` trials as a job
  tunes a task (``tuner.tune.tune_tasks``: its default schedules and seeds, then evolutionary search), into
  a fresh in-memory database (no record to transfer from), once with a fresh untrained model and once with
  a copy of the pretrained one, the order alternating from task to task.

Printed per task: the best latency after 16 and 32 trials and at the end, and the trials each needed to
come within 5 % of the best latency either found; then the geometric means over the tasks of the
pretrained/cold ratios. Latencies are MetaSchedule's measurements (the same runner for both).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from _held_out_models import MODELS
from _kiln import import_records
from _report import chosen_models, command_line, fmt, load_line, start_run, table, write_json
from poly import best_after, trials_to_reach

from kiln_tvm import estimate_flops, ms, physical_core_count
from schedules.poly.caches import host_caches
from schedules.spaces import SpaceOptions
from tuner.entities import Budget
from tuner.frontend import load_model
from tuner.metaschedule.callback import TrialBatch
from tuner.metaschedule.cost_model import RankingCostModel, load_cost_model, xgb_model
from tuner.passes.plan import plan_graph
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.targets import canonical_target_key, resolve_target, to_tvm_target
from tuner.tune import MeasureConfig, tune_tasks

SEED = 0
#: Within this share of the best latency either condition found: "reached".
NEAR = 1.05
CHECKPOINTS = (16, 32)


def _open(path: Path) -> Store:
    store = Store.from_settings(Settings(data_dir=path, database_url=None))
    store.upgrade()  # a store of an older run is brought to this Kiln's schema
    return store


def _heaviest(tasks: list[Any], count: int) -> list[Any]:
    return sorted(tasks, key=lambda t: -int(t.weight) * estimate_flops(t.dispatched[0]))[:count]


def _tune(task: Any, target: Any, model: Any, trials: int, work: Path) -> dict[str, Any]:
    """One task tuned for ``trials`` with ``model``: its latency curve (us per trial, measurement order)."""
    curve: list[float | None] = []

    def on_batch(batch: TrialBatch) -> None:
        curve.extend(batch.latencies_us)

    ranking = RankingCostModel(model)
    tune_tasks(
        [task],
        target,
        ms.database.MemoryDatabase(),
        budget=Budget(trials=trials, seed=SEED),
        config=MeasureConfig(space_options=SpaceOptions(caches=host_caches())),
        work_dir=work,
        on_batch=on_batch,
        cost_model=ranking,
    )
    first = next(iter(ranking.first_ranked.values()), None)
    return {"curve": curve, "first_ranked_with_samples": first}


def _model_row(name: str, task: Any, runs: dict[str, dict[str, Any]], trials: int) -> dict[str, Any]:
    curves = {cond: run["curve"] for cond, run in runs.items()}
    found = [c for curve in curves.values() for c in curve if c is not None]
    best = min(found) if found else None
    row: dict[str, Any] = {"model": name, "task": str(task.task_name), "best_us": best}
    for cond, curve in curves.items():
        row[cond] = {
            **{f"best_after_{n}": best_after(curve, n) for n in (*CHECKPOINTS, trials)},
            "trials_to_near_best": None if best is None else trials_to_reach(curve, best * NEAR),
            "first_ranked_with_samples": runs[cond]["first_ranked_with_samples"],
            "trials": len(curve),
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--from", dest="source", required=True, type=Path, help="a time_to_fast run's work dir"
    )
    parser.add_argument("--models", default=None, help=f"of {', '.join(MODELS)} (default: the run's)")
    parser.add_argument("--tasks", type=int, default=2, help="heaviest tasks per model")
    parser.add_argument("--trials", type=int, default=64, help="trials per task and condition")
    args = parser.parse_args()
    ran = sorted(p.name for p in (args.source / "cold").iterdir() if (p / "kiln.db").exists())
    names = chosen_models(parser, args.models or ",".join(ran), tuple(ran))
    run_stamp, work, meta = start_run("cost_model_reuse")
    print(load_line(), file=sys.stderr)
    host = resolve_target("host")
    target, target_key = to_tvm_target(host), canonical_target_key(host)
    sources = {name: _open(args.source / "cold" / name) for name in names}
    cores = physical_core_count()

    rows = []
    for index, name in enumerate(names):
        training = _open(work / "train" / name)
        imported = import_records([sources[o] for o in names if o != name], target_key, training)
        pretrained, _ = load_cost_model(training, target, target_key, None)
        print(
            f"{name}: trained on {pretrained.model.data_size} samples ({imported} records)", file=sys.stderr
        )
        with tempfile.TemporaryDirectory() as tmp:
            tar = Path(tmp) / "model.tar"
            pretrained.model.save(str(tar))
            onnx_path = args.source / "models" / f"{name}.onnx"
            plan = plan_graph(load_model(onnx_path).mod, target)
            for number, task in enumerate(_heaviest(plan.tasks, args.tasks)):
                order = ["cold", "pretrained"] if (index + number) % 2 == 0 else ["pretrained", "cold"]
                runs = {}
                for cond in order:
                    model = xgb_model(cores)
                    if cond == "pretrained":
                        model.load(str(tar))
                    runs[cond] = _tune(task, target, model, args.trials, work / name / f"{number}-{cond}")
                row = _model_row(name, task, runs, args.trials)
                rows.append(row)
                print(
                    f"  {row['task']}: best {fmt(row['best_us'], '.1f')} us; trials to within 5 %: "
                    f"cold {row['cold']['trials_to_near_best']}, "
                    f"pretrained {row['pretrained']['trials_to_near_best']}",
                    file=sys.stderr,
                )
    print(report(rows, args.trials))
    meta.update({"command": command_line(), "rows": rows})
    print(f"raw results: {write_json('cost_model_reuse', run_stamp, meta)}", file=sys.stderr)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _geomean(values: list[float | None]) -> float | None:
    known = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in known) / len(known)) if known else None


def report(rows: list[dict[str, Any]], trials: int) -> str:
    """Markdown: per task, best latency after 16, 32 and all trials and trials to within 5 % of the best,
    cold and pretrained; the geometric means of the pretrained/cold ratios."""
    points = (*CHECKPOINTS, trials)
    head = ["model", "task", "best us"]
    for cond in ("cold", "pretrained"):
        head += [f"{cond} after {n}" for n in points] + [f"{cond} trials to 5 %"]
    body, ratios = [], {p: [] for p in (*points, "trials")}
    for row in rows:
        cells = [row["model"], row["task"], fmt(row["best_us"], ".1f")]
        for cond in ("cold", "pretrained"):
            cells += [fmt(row[cond][f"best_after_{n}"], ".1f") for n in points]
            reached = row[cond]["trials_to_near_best"]
            cells.append(str(reached) if reached is not None else f">{row[cond]['trials']}")
        body.append(cells)
        for n in points:
            ratios[n].append(_ratio(row["pretrained"][f"best_after_{n}"], row["cold"][f"best_after_{n}"]))
        ratios["trials"].append(
            _ratio(row["pretrained"]["trials_to_near_best"], row["cold"]["trials_to_near_best"])
        )
    means = (
        ", ".join(f"latency after {n} trials {fmt(_geomean(ratios[n]), '.2f')}" for n in points)
        + f", trials to within 5 % {fmt(_geomean(ratios['trials']), '.2f')}"
    )
    return (
        "Best latency (us) after N trials, and trials to within 5 % of the best either found\n\n"
        + table(head, body)
        + f"\n\nGeometric means, pretrained / cold (below 1: the pretrained model is better): {means}"
    )


if __name__ == "__main__":
    main()
