"""How fast Kiln's artifact is after 0 s, 1, 2, 5, 10 and 30 minutes of tuning, from a cold store and from a
store warmed by the other models, side by side with onnxruntime and OpenVINO.

    .venv/bin/python bench/time_to_fast.py [--models resnet18,...] [--cold 0,1m,2m,5m,10m,30m]
                                           [--warm 0,1m,2m,5m] [--rounds 3] [--quick] [--svg PATH]
    .venv/bin/python bench/time_to_fast.py --report bench/work/time_to_fast-STAMP.json [--svg PATH]
    .venv/bin/python bench/time_to_fast.py --zero-from bench/work/time_to_fast-STAMP.json [--rounds 3]
    .venv/bin/python bench/time_to_fast.py --zero-cold [--models ...] [--rounds 3] [--quick]

The models (bench/_held_out_models.py) are real architectures built with random weights by transformers'
constructors: none of them is one of Kiln's own test or bench models.

* **Cold**: each model is tuned in a fresh store of its own, with a time budget of the last ``--cold``
  checkpoint. Kiln keeps every measured schedule with the time it was stored, so the artifact at each
  checkpoint *t* is rebuilt exactly as the job builds its own, from the records stored up to *t* seconds
  after tuning began (``KilnDatabase(max_record_id=...)``): the best record of each task, else the same
  operator at another shape, else a schedule built without measuring (the job's own choice,
  ``tuner.schedule_choice``). *t* = 0 is the zero-trial artifact.
* **Warm** (leave one out): each model is tuned again in a fresh store holding every record the cold runs
  of the *other* models measured (their workloads, and the cost model trained on them when the job loads
  it), with a time budget of the last ``--warm`` checkpoint; the same snapshots.

Then, in interleaved rounds, every snapshot, onnxruntime (CPU EP) and OpenVINO (CPU, fp32 and its default
precision) run in fresh processes on the same seeded inputs (bench/_timing.py); each Kiln snapshot's
outputs are checked against onnxruntime's. It prints per model the latency at each checkpoint and the
ratio onnxruntime ms / Kiln ms (above 1: Kiln is faster), their geometric mean over the models per
checkpoint, and the share of its last cold latency each checkpoint reached.

``--zero-cold`` builds only the cold zero-trial artifacts, without a job (no store, no verification run):
each model's as this Kiln builds it, and as it builds it without the analytic schedules
(:mod:`schedules.analytic`; the polyhedral model's tilings and design-space samples in their place, the
order of trust before them), with the wall time of each build (import, planning, schedules, compiling);
then times both beside the peers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from _curves_svg import write_curves
from _held_out_models import DEFAULT_MODELS, MODELS, describe, export
from _kiln import _StageClock, import_records
from _report import chosen_models, command_line, fmt, load_line, start_run, table, write_json
from _timing import Reps, interleaved, reps_for, save_inputs, time_in_fresh_process

from cli.durations import format_duration, parse_duration
from schedules.amx import amx_kinds
from tuner import schedule_choice
from tuner.compile import build_tuned, random_inputs
from tuner.entities import JobSpec, JobStatus
from tuner.frontend import load_model
from tuner.jobs.artifact import export_library
from tuner.jobs.measuring import job_caches, measuring_caches
from tuner.jobs.pipeline import run_job
from tuner.jobs.submission import submit_job
from tuner.metaschedule.database import KilnDatabase
from tuner.model_registry import register_model
from tuner.passes.plan import plan_graph
from tuner.schedule_choice import choose_schedules
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.targets import resolve_target, to_tvm_target

SEED = 0
PEERS = {
    "onnxruntime": "onnxruntime (CPU EP)",
    "openvino-fp32": "OpenVINO fp32",
    "openvino": "OpenVINO default",
}


class _TuningStart(_StageClock):
    """The stage clock, noting the wall-clock time tuning began (what the checkpoints count from)."""

    started: datetime | None = None

    def stage(self, name: str) -> None:
        if name == "tuning" and self.started is None:
            self.started = datetime.now(timezone.utc)
        super().stage(name)


@dataclass
class Snapshot:
    """The artifact at one checkpoint of one run."""

    condition: str  # "cold" or "warm"
    seconds: float
    records: int  # the job's records stored by then
    library: Path
    sources: dict[str, int] = field(default_factory=dict)  # schedule source -> kernels


def _open(data_dir: Path, share: bool) -> tuple[Settings, Store]:
    # No profile: the jobs' kernel-by-kernel profile is not what this measures, and takes minutes.
    settings = Settings(data_dir=data_dir, database_url=None, share_records=share, profile_budget_s=0)
    store = Store.from_settings(settings)
    store.ensure_schema()
    return settings, store


def _tune(
    store: Store, settings: Settings, onnx_path: Path, label: str, budget_s: float
) -> tuple[Any, datetime]:
    info, _ = register_model(store, settings, onnx_path, name=label)
    spec = JobSpec(
        model_id=info.id,
        target=resolve_target("host"),
        trials=None if budget_s > 0 else 0,
        seed=SEED,
        time_budget_s=budget_s if budget_s > 0 else None,
    )
    job = submit_job(store, spec)
    clock = _TuningStart(label)
    result = run_job(store, settings, job.id, listener=clock)
    clock.close()
    if result.job.status is not JobStatus.SUCCEEDED:
        raise RuntimeError(f"{label}: job {job.id} {result.job.status.value}: {result.job.error}")
    return result.job, clock.started or datetime.now(timezone.utc)


def _snapshots(
    store: Store,
    settings: Settings,
    onnx_path: Path,
    job: Any,
    started: datetime,
    checkpoints: list[float],
    condition: str,
    out: Path,
    floor_record: int,
) -> list[Snapshot]:
    """The artifact at each checkpoint, rebuilt from the records stored by then (and every record up to
    ``floor_record``, those of the store before the job)."""
    target = to_tvm_target(job.spec.target)
    plan = plan_graph(
        load_model(onnx_path).mod,
        target,
        settings.planning_options(job.spec.precision),
    )
    records = store.list_records(job_id=job.id)
    snapshots = []
    for seconds in checkpoints:
        upto = started + timedelta(seconds=seconds)
        mine = [r.id for r in records if r.created_at <= upto] if seconds > 0 else []
        cutoff = max([floor_record, *mine])
        database = KilnDatabase(
            store, job.target_key, owner=settings.record_scope(job.owner), max_record_id=cutoff
        )
        chosen, choices = choose_schedules(plan.tasks, target, database, job_caches(settings, job.spec))
        library = export_library(
            build_tuned(plan, target, chosen),
            out / f"{condition}-{int(seconds)}s.so",
            amx=bool(amx_kinds(target)),
        )
        sources: dict[str, int] = {}
        for choice in choices:
            sources[choice.source.value] = sources.get(choice.source.value, 0) + 1
        snapshots.append(Snapshot(condition, seconds, len(mine), Path(library), sources))
        print(f"    {condition} {format_duration(seconds)}: {len(mine)} records, {sources}", file=sys.stderr)
    return snapshots


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"of {', '.join(MODELS)}")
    parser.add_argument("--cold", default="0,1m,2m,5m,10m,30m", help="checkpoints of the cold runs")
    parser.add_argument("--warm", default="0,1m,2m,5m", help="checkpoints of the warm runs ('' for none)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="fewer timed calls per round")
    parser.add_argument("--svg", type=Path, default=None, help="where the curves go (default: the run's dir)")
    parser.add_argument(
        "--report",
        metavar="RAW_JSON",
        type=Path,
        help="only print a finished run's table and draw its curves",
    )
    parser.add_argument(
        "--zero-from",
        metavar="RAW_JSON",
        type=Path,
        help="rebuild a finished run's 0 s snapshots (cold and warm) with this Kiln and time them again",
    )
    parser.add_argument(
        "--zero-cold",
        action="store_true",
        help="only the cold zero-trial artifacts, with and without the analytic schedules, built without a job",
    )
    args = parser.parse_args()
    if args.zero_cold:
        _zero_cold(chosen_models(parser, args.models, tuple(MODELS)), reps_for(args.quick, args.rounds))
        return
    if args.zero_from:
        _zero_again(args.zero_from, reps_for(args.quick, args.rounds))
        return
    if args.report:
        raw = json.loads(args.report.read_text())
        seconds = {
            c: sorted({s["seconds"] for r in raw["results"] for s in r["snapshots"] if s["condition"] == c})
            for c in ("cold", "warm")
        }
        print(report(raw["results"], seconds["cold"], seconds["warm"], raw.get("failures")))
        svg = write_curves(raw["results"], args.svg or args.report.with_suffix(".svg"))
        print(f"curves: {svg}", file=sys.stderr)
        return
    names = chosen_models(parser, args.models, tuple(MODELS))
    cold = _checkpoints(args.cold)
    warm = _checkpoints(args.warm) if args.warm else []
    reps = reps_for(args.quick, args.rounds)
    run_stamp, work, meta = start_run("time_to_fast")
    print(load_line(), file=sys.stderr)

    paths = {name: export(name, work / "models", SEED) for name in names}
    stores: dict[str, Store] = {}
    snapshots: dict[str, list[Snapshot]] = {name: [] for name in names}
    tuning_s: dict[str, dict[str, float]] = {name: {} for name in names}
    target_key = ""
    failures: dict[str, list[str]] = {name: [] for name in names}
    for name in names:  # cold, each in its own store
        settings, store = _open(work / "cold" / name, share=False)
        stores[name] = store
        try:
            start = time.perf_counter()
            job, started = _tune(store, settings, paths[name], name, cold[-1])
            tuning_s[name]["cold"] = time.perf_counter() - start
            target_key = job.target_key
            snapshots[name] += _snapshots(
                store, settings, paths[name], job, started, cold, "cold", work / name, 0
            )
        except Exception as exc:  # noqa: BLE001 - one model's failure is reported, the others still run
            failures[name].append(f"cold: {type(exc).__name__}: {exc}")
            print(f"{name} cold failed: {exc!r}", file=sys.stderr)
    if warm and len(names) > 1 and target_key:
        for name in names:  # warm: every other model's cold records, none of its own
            settings, store = _open(work / "warm" / name, share=True)
            try:
                prior = import_records([stores[o] for o in names if o != name], target_key, store)
                start = time.perf_counter()
                job, started = _tune(store, settings, paths[name], name, warm[-1])
                tuning_s[name]["warm"] = time.perf_counter() - start
                snapshots[name] += _snapshots(
                    store, settings, paths[name], job, started, warm, "warm", work / name, prior
                )
            except Exception as exc:  # noqa: BLE001 - as above
                failures[name].append(f"warm: {type(exc).__name__}: {exc}")
                print(f"{name} warm failed: {exc!r}", file=sys.stderr)

    results = []
    for name in names:
        try:
            timed = _time_model(name, paths[name], snapshots[name], tuning_s[name], work / name, reps)
        except Exception as exc:  # noqa: BLE001 - a snapshot that fails its check loses its model's row only
            failures[name].append(f"timing: {type(exc).__name__}: {exc}")
            print(f"{name} timing failed: {exc!r}", file=sys.stderr)
            continue
        results.append(timed)
    text = report(results, cold, warm, failures)
    print(text)
    meta.update({"command": command_line(), "results": results, "failures": failures})
    print(f"raw results: {write_json('time_to_fast', run_stamp, meta)}", file=sys.stderr)
    print(f"curves: {write_curves(results, args.svg or work / 'curves.svg')}", file=sys.stderr)


def _zero_again(raw_json: Path, reps: Reps) -> None:
    """The zero-trial artifacts of a finished run rebuilt by this Kiln from the same stores (cold: no
    record; warm: the other models' records only), timed side by side with the peers."""
    run_dir = raw_json.with_suffix("")
    names = [r["model"]["name"] for r in json.loads(raw_json.read_text())["results"]]
    run_stamp, work, meta = start_run("time_to_fast_zero")
    print(load_line(), file=sys.stderr)
    results = []
    for name in names:
        onnx_path = run_dir / "models" / f"{name}.onnx"
        snaps = []
        for condition in ("cold", "warm"):
            settings, store = _open(run_dir / condition / name, share=condition == "warm")
            job = store.list_jobs()[0]
            # What the store held before the job: the records it imported (no job's), none when cold.
            prior = max((r.id for r in store.list_records() if r.job_id is None), default=0)
            snaps += _snapshots(
                store, settings, onnx_path, job, job.created_at, [0.0], condition, work / name, prior
            )
        results.append(_time_model(name, onnx_path, snaps, {}, work / name, reps))
    print(report(results, [0.0], [0.0]))
    meta.update({"command": command_line(), "from": str(raw_json), "results": results})
    print(f"raw results: {write_json('time_to_fast_zero', run_stamp, meta)}", file=sys.stderr)


def _zero_cold(names: list[str], reps: Reps) -> None:
    """Each model's cold zero-trial artifact with and without the analytic schedules, timed beside the peers."""
    run_stamp, work, meta = start_run("time_to_fast_zero_cold")
    print(load_line(), file=sys.stderr)
    target = to_tvm_target(resolve_target("host"))
    settings = Settings()
    caches = measuring_caches(settings, True)
    results, build_s = [], {}
    for name in names:
        onnx_path = export(name, work / "models", SEED)
        snaps = []
        for condition, analytic in (("cold", True), (WITHOUT_ANALYTIC, False)):
            start = time.perf_counter()
            plan = plan_graph(load_model(onnx_path).mod, target, settings.planning_options("as-is"))
            with _analytic_rule(analytic):
                chosen, choices = choose_schedules(plan.tasks, target, None, caches)
            library = export_library(
                build_tuned(plan, target, chosen),
                work / name / f"{condition}-0s.so",
                amx=bool(amx_kinds(target)),
            )
            build_s[f"{name}/{condition}"] = time.perf_counter() - start
            sources: dict[str, int] = {}
            for choice in choices:
                sources[choice.source.value] = sources.get(choice.source.value, 0) + 1
            print(f"  {name} {condition}: {build_s[f'{name}/{condition}']:.0f} s, {sources}", file=sys.stderr)
            snaps.append(Snapshot(condition, 0.0, 0, Path(library), sources))
        results.append(_time_model(name, onnx_path, snaps, {}, work / name, reps))
    print(report(results, [0.0], [], extra=[WITHOUT_ANALYTIC]))
    print("\nWall time of each zero-trial build (import, planning, schedules, compiling), s:")
    print(
        table(
            ["model", "with analytic", "without"],
            [
                [n, fmt(build_s.get(f"{n}/cold"), ".0f"), fmt(build_s.get(f"{n}/{WITHOUT_ANALYTIC}"), ".0f")]
                for n in names
            ],
        )
    )
    meta.update({"command": command_line(), "results": results, "build_s": build_s})
    print(f"raw results: {write_json('time_to_fast_zero_cold', run_stamp, meta)}", file=sys.stderr)


WITHOUT_ANALYTIC = "no-analytic"


@contextmanager
def _analytic_rule(enabled: bool) -> Iterator[None]:
    """Within the block, the zero-trial choice with (as Kiln runs) or without the analytic rule."""
    if enabled:
        yield
        return
    original = schedule_choice.analytic_schedule
    schedule_choice.analytic_schedule = lambda context, isa: None
    try:
        yield
    finally:
        schedule_choice.analytic_schedule = original


def _time_model(
    name: str, onnx_path: Path, snaps: list[Snapshot], tuning: dict[str, float], work: Path, reps: Reps
) -> dict[str, Any]:
    """Time every snapshot of one model and its peers, interleaved, each in a fresh process."""
    imported = load_model(onnx_path)
    names = [t.name for t in imported.signature.inputs]
    npz = save_inputs(
        work / "inputs.npz", dict(zip(names, random_inputs(imported.signature, SEED), strict=True))
    )
    reference = work / "onnxruntime" / "outputs.npz"
    timers: dict[str, Callable[[], dict[str, Any]]] = {
        "onnxruntime": lambda: time_in_fresh_process(
            "onnxruntime", onnx_path, npz, reps, out_dir=reference.parent
        )
    }
    if _has_openvino():
        for kind in ("openvino-fp32", "openvino"):
            timers[kind] = lambda kind=kind: time_in_fresh_process(
                kind, onnx_path, npz, reps, out_dir=work / kind
            )
    for snap in snaps:
        timers[f"{snap.condition}@{int(snap.seconds)}"] = lambda snap=snap: time_in_fresh_process(
            "tvm",
            snap.library,
            npz,
            reps,
            reference_npz=reference,
            tolerance=1e-3,
            out_dir=snap.library.with_suffix(""),
        )
    runs = interleaved(timers, reps.rounds)
    ort_ms = runs["onnxruntime"]["ms"]
    return {
        "model": describe(name),
        "tuning_s": tuning,
        "runs": {k: {"ms": r["ms"], "round_ms": r.get("round_ms", [])} for k, r in runs.items()},
        "snapshots": [
            {
                "condition": s.condition,
                "seconds": s.seconds,
                "records": s.records,
                "sources": s.sources,
                "ms": runs[f"{s.condition}@{int(s.seconds)}"]["ms"],
                "onnxruntime_over_kiln": ort_ms / runs[f"{s.condition}@{int(s.seconds)}"]["ms"],
            }
            for s in snaps
        ],
    }


def _checkpoints(text: str) -> list[float]:
    """Seconds of each comma-separated duration (``0``: before any tuning), in order."""
    return sorted(0.0 if v.strip() in ("0", "0s") else parse_duration(v.strip()) for v in text.split(","))


def _has_openvino() -> bool:
    import importlib.util

    return importlib.util.find_spec("openvino") is not None


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def report(
    results: list[dict[str, Any]],
    cold: list[float],
    warm: list[float],
    failures: dict[str, list[str]] | None = None,
    extra: list[str] | tuple[str, ...] = (),
) -> str:
    """Markdown: latency per model and checkpoint, the ratios' geometric means, the share of the last cold
    latency reached, and the runs that failed."""
    columns = [("cold", s) for s in cold] + [("warm", s) for s in warm] + [(c, 0.0) for c in extra]
    head = ["model", "onnxruntime ms", "OpenVINO fp32 ms", "OpenVINO default ms"] + [
        f"{c} {format_duration(s)}" for c, s in columns
    ]
    rows, ratios = [], {col: [] for col in columns}
    reached: dict[tuple[str, float], list[float]] = {col: [] for col in columns}
    for res in results:
        runs = res["runs"]
        by = {(s["condition"], s["seconds"]): s for s in res["snapshots"]}
        last_cold = by.get(("cold", cold[-1]))
        cells = []
        for col in columns:
            snap = by.get(col)
            if snap is None:
                cells.append("n/a")
                continue
            ratios[col].append(snap["onnxruntime_over_kiln"])
            if last_cold:
                reached[col].append(last_cold["ms"] / snap["ms"])
            cells.append(f"{fmt(snap['ms'], '.2f')} ({fmt(snap['onnxruntime_over_kiln'], '.2f')}x)")
        rows.append(
            [
                res["model"]["name"],
                fmt(runs["onnxruntime"]["ms"], ".2f"),
                fmt(runs.get("openvino-fp32", {}).get("ms"), ".2f"),
                fmt(runs.get("openvino", {}).get("ms"), ".2f"),
                *cells,
            ]
        )
    rows.append(
        ["**geomean onnxruntime/Kiln**", "", "", "", *(fmt(_geomean(ratios[c]), ".2f") for c in columns)]
    )
    rows.append(
        [
            "**geomean share of last cold speed**",
            "",
            "",
            "",
            *(fmt(_geomean(reached[c]), ".2f") for c in columns),
        ]
    )
    failed = [f"- {name}: {f}" for name, fails in (failures or {}).items() for f in fails]
    return (
        "Kiln ms at each checkpoint (onnxruntime ms / Kiln ms in brackets; above 1: Kiln faster)\n\n"
        + table(head, rows)
        + ("\n\nFailed runs (n/a above):\n" + "\n".join(failed) if failed else "")
    )


if __name__ == "__main__":
    main()
