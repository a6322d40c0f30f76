"""Real architectures as a user brings them: each built from its library's constructor with random weights
(torchvision, timm, transformers; ``bench/_zoo_models.py``), exported to ONNX and to ``.pt2``, and taken
through Kiln.

    .venv/bin/python bench/zoo.py [--models resnet50,gpt2] [--formats onnx,pt2] [--trials 0]
                                  [--all-torchvision] [--timeout 1200]

For each model and format, in a fresh process (a crash or a timeout costs one row):

* **export**: ``torch.onnx.export`` (opset 17, the TorchScript exporter) or ``torch.export`` + ``save``;
* **plan**: Kiln's import and graph passes (``load_model`` + ``plan_graph``), timed, with the growth of the
  process's data segment (what Kiln's import limit counts) against the weights' bytes;
* **job**: a Kiln job of ``--trials`` trials under the default settings and limits (0: Kiln's default
  schedules, the artifact a user gets in the first minute), which verifies itself against untuned TVM and,
  for ONNX, onnxruntime, and times Kiln, untuned TVM and onnxruntime side by side, each in its own process;
* **torch**: the job's artifact run on the same input as PyTorch eager, within the job's tolerances.

Needs the bench extras (``make bench`` installs them). Rows and the raw JSON go to
``bench/work/zoo-<stamp>/``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from _report import fmt, start_run, table

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("onnx", "pt2")


def export(name: str, fmt_name: str, dest: Path) -> tuple[Path, Any, Any, int]:
    """Export ``name`` as ``fmt_name`` into ``dest``: the file, the input, PyTorch's output, weight bytes."""
    import torch
    from _held_out_models import export_onnx
    from _zoo_models import zoo_model

    # nn.MultiheadAttention's fused inference path (torchvision's ViT) has no ONNX export: the composite
    # form is what a user exports.
    torch.backends.mha.set_fastpath_enabled(False)
    module, example = zoo_model(name).build()
    with torch.no_grad():
        expected = module(example)
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    weights += sum(b.numel() * b.element_size() for b in module.buffers())
    dest.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        if fmt_name == "onnx":
            path = export_onnx(module, example, dest / f"{name}.onnx")
        else:
            path = dest / f"{name}.pt2"
            torch.export.save(torch.export.export(module, (example,)), str(path))
    return path, example.numpy(), expected.numpy(), weights


def measure_plan(path: Path) -> dict[str, Any]:
    """Import and plan ``path`` as a job does: seconds, and the peak growth of the data segment (bytes)."""
    from tuner.frontend import load_model, warm_up
    from tuner.isolation.sandbox import data_segment_bytes
    from tuner.passes.plan import plan_graph
    from tuner.targets import host_target, to_tvm_target

    warm_up()
    target = to_tvm_target(host_target())
    base = data_segment_bytes()
    peak = [base]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], data_segment_bytes())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.perf_counter()
    try:
        imported = load_model(path)
        plan = plan_graph(imported.mod, target)
    finally:
        done.set()
        watcher.join()
    return {
        "plan_s": time.perf_counter() - start,
        "plan_growth": max(peak[0], data_segment_bytes()) - base,
        "tasks": len(plan.tasks),
    }


def run_kiln_job(path: Path, data_dir: Path, trials: int, rounds: int) -> dict[str, Any]:
    """A Kiln job on ``path`` with the default settings but ``rounds`` latency rounds: its outcome, figures
    and artifact library."""
    from _kiln import _extract

    from tuner.entities import JobSpec, JobStatus
    from tuner.jobs.pipeline import run_job
    from tuner.jobs.submission import submit_job
    from tuner.model_registry import register_model
    from tuner.settings import Settings
    from tuner.store.sql import Store
    from tuner.targets import host_target

    settings = Settings(
        data_dir=data_dir,
        database_url=None,
        share_records=False,
        profile_budget_s=0,
        latency_rounds=rounds,
    )
    store = Store.from_settings(settings)
    store.ensure_schema()
    model, _ = register_model(store, settings, path)
    job = submit_job(store, JobSpec(model_id=model.id, target=host_target(), trials=trials))
    start = time.perf_counter()
    result = run_job(store, settings, job.id)
    figures: dict[str, Any] = {
        "job_s": time.perf_counter() - start,
        "status": result.job.status.value,
        "error": result.job.error,
        "comparisons": {c.reference: c.max_rel_error for c in result.comparisons},
        "kiln_ms": result.latency.tuned_ms,
        "untuned_ms": result.latency.untuned_ms,
        "onnxruntime_ms": result.latency.references_ms.get("onnxruntime"),
        "rtol": settings.verify_rtol,
        "atol": settings.verify_atol,
    }
    if result.job.status is JobStatus.SUCCEEDED and result.artifact is not None:
        unpacked = data_dir / "unpacked"
        _extract(Path(result.artifact.path), unpacked)
        figures["library"] = str(unpacked / "model.so")
    return figures


def against_torch(library: str, example: Any, expected: Any, rtol: float, atol: float) -> dict[str, Any]:
    """The artifact at ``library`` run on PyTorch's input, compared with PyTorch's output."""
    from kiln_tvm import tvm
    from tuner.compile import LoadedModel
    from tuner.timing.verify import compare_outputs

    outputs = LoadedModel(tvm.runtime.load_module(library)).run([example])
    comparison = compare_outputs(outputs[:1], [expected], "PyTorch", rtol, atol)
    scale = float(abs(expected).max()) or 1.0
    # The largest difference against the output's range: an element's relative error means little
    # where the output crosses zero.
    return {"torch_ok": comparison.ok, "torch_err": comparison.max_abs_error / scale}


def one(name: str, fmt_name: str, trials: int, rounds: int) -> dict[str, Any]:
    """Every stage for one model in one format, in this process; a failing stage ends the row with it."""
    row: dict[str, Any] = {"model": name, "format": fmt_name}
    with tempfile.TemporaryDirectory(prefix="kiln-zoo-") as tmp:
        work = Path(tmp)
        stage = "export"
        try:
            path, example, expected, weights = export(name, fmt_name, work / "model")
            row["weights_mib"] = weights / 2**20
            stage = "plan"
            row.update(measure_plan(path))
            row["plan_ratio"] = row["plan_growth"] / weights if weights else None
            stage = "job"
            job = run_kiln_job(path, work / "kiln", trials, rounds)
            row.update({k: v for k, v in job.items() if k != "library"})
            if "library" in job:
                stage = "torch"
                row.update(against_torch(job["library"], example, expected, job["rtol"], job["atol"]))
        except Exception as exc:  # the row says which stage failed and why; the next model goes on
            row["failed"] = stage
            row["error"] = (
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc) else ''}"
            )
            traceback.print_exc(file=sys.stderr)
    return row


def run_row(name: str, fmt_name: str, trials: int, rounds: int, timeout_s: float) -> dict[str, Any]:
    """:func:`one` in a fresh process, bounded by ``timeout_s``."""
    command = [sys.executable, __file__, "--one", name, fmt_name, "--trials", str(trials)]
    command += ["--latency-rounds", str(rounds)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"model": name, "format": fmt_name, "failed": "timeout", "error": f"over {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return {"model": name, "format": fmt_name, "failed": "crash", "error": tail[0][:300]}
    return json.loads(lines[-1])


def _verdict(row: dict[str, Any]) -> str:
    if "failed" in row:
        return f"{row['failed']} failed: {row['error']}"
    if row.get("status") != "succeeded":
        return f"job {row.get('status')}: {(row.get('error') or '')[:200]}"
    return (
        "ok" if row.get("torch_ok") else f"differs from PyTorch ({row.get('torch_err', 0):.1e} of its range)"
    )


def report(rows: list[dict[str, Any]]) -> str:
    """The zoo's markdown table."""
    body = []
    for r in rows:
        ort = r.get("onnxruntime_ms")
        kiln = r.get("kiln_ms")
        body.append(
            [
                r["model"],
                r["format"],
                fmt(r.get("weights_mib"), ".0f"),
                fmt(r.get("plan_s"), ".1f"),
                fmt(r["plan_growth"] / 2**20 if "plan_growth" in r else None, ".0f"),
                fmt(r.get("plan_ratio"), ".1f"),
                fmt(r.get("torch_err"), ".1e"),
                fmt(kiln, ".2f"),
                fmt(r.get("untuned_ms"), ".2f"),
                fmt(ort, ".2f"),
                fmt(ort / kiln if ort and kiln else None, ".2f"),
                _verdict(r),
            ]
        )
    headers = [
        "model",
        "format",
        "weights MiB",
        "plan s",
        "plan MiB",
        "x weights",
        "max err vs PyTorch / max output",
        "Kiln ms",
        "untuned TVM ms",
        "onnxruntime ms",
        "ORT / Kiln",
        "verdict",
    ]
    return table(headers, body)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", help="comma-separated names (default: every model of _zoo_models.MODELS)")
    parser.add_argument(
        "--all-torchvision",
        action="store_true",
        help="every torchvision classification and segmentation model instead",
    )
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--trials", type=int, default=0, help="tuning trials per job (0: default schedules)")
    parser.add_argument(
        "--latency-rounds",
        type=int,
        default=3,
        help="the job's side-by-side timing rounds (Kiln's default 3; 1 for a run that is about coverage)",
    )
    parser.add_argument(
        "--skip", nargs="+", metavar="JSON", help="leave out the rows these zoo.json files hold"
    )
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per model and format")
    parser.add_argument(
        "--report",
        nargs="+",
        metavar="JSON",
        help="print the table of earlier runs' zoo.json files instead (the last row of each model and format)",
    )
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "FORMAT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.trials, args.latency_rounds)))
        return
    if args.report:  # a later file's row replaces an earlier one of the same model and format
        latest = {
            (row["model"], row["format"]): row
            for path in args.report
            for row in json.loads(Path(path).read_text())["rows"]
        }
        print(report(list(latest.values())))
        return

    from _zoo_models import MODELS, torchvision_models

    names = (
        torchvision_models()
        if args.all_torchvision
        else (args.models.split(",") if args.models else list(MODELS))
    )
    skipped = {
        (row["model"], row["format"])
        for path in args.skip or []
        for row in json.loads(Path(path).read_text())["rows"]
    }
    run_stamp, work, _ = start_run("zoo")
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        for fmt_name in args.formats.split(","):
            if (name, fmt_name) in skipped:
                continue
            row = run_row(name, fmt_name, args.trials, args.latency_rounds, args.timeout)
            rows.append(row)
            print(f"  {name} {fmt_name}: {_verdict(row)}", file=sys.stderr, flush=True)
            (work / "zoo.json").write_text(
                json.dumps(
                    {"stamp": run_stamp, "trials": args.trials, "rounds": args.latency_rounds, "rows": rows},
                    indent=1,
                )
            )
    print(report(rows))
    ok = sum(1 for r in rows if _verdict(r) == "ok")
    print(
        f"\n{ok} of {len(rows)} verified against PyTorch ({args.trials} trials per job, "
        f"{args.latency_rounds} latency rounds)"
    )


if __name__ == "__main__":
    main()
