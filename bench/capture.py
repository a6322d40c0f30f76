"""Graph vs eager, measured: the same model eager, captured and compiled, and tuned.

For each model of ``_capture_models.py`` (an MLP, a small CNN, a transformer block, written in this
benchmark), side by side in one run, each implementation in its own process:

* ``eager``: PyTorch eager (``torch.no_grad``);
* ``inductor``: ``torch.compile(model)``, PyTorch's default backend;
* ``kiln-untuned``: ``torch.compile(model, backend="kiln", options={"freeze": True})`` over an empty
  store: every kernel on a schedule Kiln builds without measuring;
* ``kiln-tuned``: the same over the store a tuning run filled (``options={"tune": N}``, in a process
  of its own before the timings; its tuning time is reported);
* ``jax``: ``jax.jit`` of the same model written in JAX;
* ``kiln-jax``: that JAX program exported (``jax.export``) and tuned by a Kiln job, its artifact run.

Usage::

    python bench/capture.py [--models mlp,cnn,transformer] [--tune-s 240] [--rounds 2] [--quick]

Every child times the one call that runs the model (``perf_counter`` loop, warmup, median), after its
first call compiled it (compile time reported), and checks its outputs against eager's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(1, str(BENCH.parent))

from _capture_models import MODELS, example_input, jax_function, torch_model  # noqa: E402
from _report import chosen_models, fmt, start_run, table, write_json  # noqa: E402
from _timing import Reps, interleaved, measure, physical_cores, reps_for  # noqa: E402

TIMED = ("eager", "inductor", "kiln-untuned", "kiln-tuned", "jax", "kiln-jax")
TOLERANCE = 2e-3  # absolute, against eager (fast-math exp/tanh in Kiln's builds; XLA's own approximations)


# ---- children -------------------------------------------------------------------------------------


def _torch_callable(kind: str, name: str, store: Path) -> Any:
    import torch

    torch.set_num_threads(physical_cores())
    model = torch_model(name)
    if kind == "eager":
        return model
    if kind == "inductor":
        return torch.compile(model)
    return torch.compile(model, backend="kiln", options={"data_dir": str(store), "freeze": True})


def _child_time(kind: str, name: str, store: Path, out: Path, reps: Reps) -> None:
    x = example_input(name)
    if kind in ("jax", "kiln-jax"):
        run, first_s = _jax_side(kind, name, store, x)
    else:
        import torch

        fn = _torch_callable(kind, name, store)
        tx = torch.from_numpy(x)

        def run() -> Any:
            with torch.no_grad():
                return fn(tx)

        start = time.perf_counter()
        run()
        first_s = time.perf_counter() - start
    outputs = run()
    timing = measure(run, reps)
    flat = [np.asarray(o) for o in (outputs if isinstance(outputs, list | tuple) else [outputs])]
    np.savez(out / "outputs.npz", *flat)
    result = {"kind": kind, "model": name, "first_call_s": first_s, **timing.__dict__}
    (out / "result.json").write_text(json.dumps(result))


def _jax_side(kind: str, name: str, store: Path, x: np.ndarray) -> tuple[Any, float]:
    if kind == "jax":
        import jax

        fn = jax.jit(jax_function(name))
        start = time.perf_counter()
        fn(x).block_until_ready()
        first_s = time.perf_counter() - start
        return (lambda: fn(x).block_until_ready()), first_s

    from kiln_tvm import tvm
    from tuner.compile import LoadedModel

    start = time.perf_counter()
    loaded = LoadedModel(tvm.runtime.load_module(str(store / f"jax-{name}" / "model.so")))
    call = loaded.bound_call([x])
    call()
    first_s = time.perf_counter() - start
    return (lambda: call().numpy()), first_s


def _child_tune_torch(name: str, store: Path, out: Path, tune_s: float) -> None:
    import torch

    model = torch_model(name)
    options = {"data_dir": str(store), "freeze": True, "tune": 100_000, "time_budget_s": tune_s}
    start = time.perf_counter()
    with torch.no_grad():
        torch.compile(model, backend="kiln", options=options)(torch.from_numpy(example_input(name)))
    from tuner.capture import compiled_graphs

    report = compiled_graphs()[-1].report
    result = {
        "seconds": time.perf_counter() - start,
        "job_id": report.job_id,
        "kernels": len(report.kernels),
        "tuned": report.tuned,
    }
    (out / "result.json").write_text(json.dumps(result))


def _child_tune_jax(name: str, store: Path, out: Path, tune_s: float) -> None:
    import jax
    from jax import export

    from tuner.entities import JobSpec
    from tuner.jobs.pipeline import run_job
    from tuner.jobs.submission import submit_job
    from tuner.model_registry import register_model
    from tuner.settings import Settings
    from tuner.store import Store
    from tuner.targets import host_target

    x = example_input(name)
    exported = export.export(jax.jit(jax_function(name)))(jax.ShapeDtypeStruct(x.shape, x.dtype))
    path = out / f"{name}.jax"
    path.write_bytes(bytes(exported.serialize()))
    settings = Settings(data_dir=store, database_url=None)
    db = Store.from_settings(settings)
    db.ensure_schema()
    start = time.perf_counter()
    model, _ = register_model(db, settings, path, name=f"jax-{name}")
    job = submit_job(db, JobSpec(model_id=model.id, target=host_target(), trials=None, time_budget_s=tune_s))
    result = run_job(db, settings, job.id)
    dest = store / f"jax-{name}"
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(result.artifact.path) as tar:
        tar.extractall(dest, filter="data")
    (out / "result.json").write_text(
        json.dumps({"seconds": time.perf_counter() - start, "job_id": job.id, "tasks": len(result.tasks)})
    )


def _child(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind")
    parser.add_argument("model")
    parser.add_argument("store", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tune-s", type=float, default=60.0)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.kind == "tune-torch":
        _child_tune_torch(args.model, args.store, args.out, args.tune_s)
    elif args.kind == "tune-jax":
        _child_tune_jax(args.model, args.store, args.out, args.tune_s)
    else:
        _child_time(args.kind, args.model, args.store, args.out, Reps(calls=args.calls, warmup=args.warmup))


# ---- the parent -----------------------------------------------------------------------------------


def _run_child(args: list[str], out: Path, timeout_s: float = 3600.0) -> dict[str, Any]:
    env = dict(os.environ, TVM_NUM_THREADS=str(physical_cores()))
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise RuntimeError(f"child {args[:2]} failed (exit {proc.returncode}):\n{tail}")
    result = json.loads((out / "result.json").read_text())
    result["outputs_npz"] = str(out / "outputs.npz")
    return result


def _max_error(result: dict[str, Any], reference: dict[str, Any]) -> float:
    with np.load(result["outputs_npz"]) as got, np.load(reference["outputs_npz"]) as want:
        return max(
            float(np.max(np.abs(got[k].astype(np.float64) - want[k].astype(np.float64)))) for k in want.files
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}"
    )
    parser.add_argument(
        "--tune-s", type=float, default=240.0, help="Kiln's tuning seconds per model and side"
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 2)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 s of tuning, few calls")
    args = parser.parse_args()
    models = chosen_models(parser, args.models, MODELS)
    reps = reps_for(args.quick, args.rounds, Reps(rounds=2))
    tune_s = 20.0 if args.quick else args.tune_s

    run_stamp, work, mach = start_run("capture")
    print(f"tuning: {tune_s:.0f} s per model for the torch.compile backend and for the JAX program")
    results: dict[str, Any] = {}
    rows = []
    for name in models:
        store, empty = work / name / "store", work / name / "empty-store"
        tuned_torch = _run_child(
            ["tune-torch", name, str(store), f"--tune-s={tune_s}"], work / name / "tune-torch"
        )
        tuned_jax = _run_child(["tune-jax", name, str(store), f"--tune-s={tune_s}"], work / name / "tune-jax")
        runs = itertools.count()

        def timer(
            kind: str, name: str = name, store: Path = store, empty: Path = empty, runs: Any = runs
        ) -> Any:
            where = empty if kind == "kiln-untuned" else store
            flags = [f"--calls={reps.calls}", f"--warmup={reps.warmup}"]
            return lambda: _run_child([kind, name, str(where), *flags], work / name / f"{kind}-{next(runs)}")

        timed = interleaved({kind: timer(kind) for kind in TIMED}, reps.rounds)
        errors = {kind: _max_error(timed[kind], timed["eager"]) for kind in TIMED}
        results[name] = {"timed": timed, "errors": errors, "tune_torch": tuned_torch, "tune_jax": tuned_jax}
        ms = {kind: timed[kind]["ms"] for kind in TIMED}
        rows.append(
            [
                name,
                *(fmt(ms[k]) for k in TIMED),
                fmt(ms["inductor"] / ms["kiln-tuned"], ".2f"),
                fmt(ms["jax"] / ms["kiln-jax"], ".2f"),
                f"{max(errors.values()):.1e}",
            ]
        )
        print(f"{name}: " + ", ".join(f"{k} {fmt(ms[k])} ms" for k in TIMED), flush=True)
        print(
            f"  tuning: torch.compile backend {tuned_torch['seconds']:.0f} s ({tuned_torch['tuned']} of "
            f"{tuned_torch['kernels']} kernels tuned), JAX job {tuned_jax['seconds']:.0f} s; first calls "
            + ", ".join(f"{k} {timed[k]['first_call_s']:.1f} s" for k in TIMED)
        )
        bad = {k: e for k, e in errors.items() if e > TOLERANCE}
        if bad:
            print(f"  WARNING: outputs differ from eager by more than {TOLERANCE}: {bad}")

    headers = [
        "model",
        *(f"{k} ms" for k in TIMED),
        "inductor / kiln-tuned",
        "jax.jit / kiln-jax",
        "max abs err vs eager",
    ]
    print()
    print(table(headers, rows))
    path = write_json("capture", run_stamp, {"machine": mach, "tune_s": tune_s, "results": results})
    print(f"\nraw results: {path}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
    else:
        main()
