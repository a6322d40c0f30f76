"""Time one implementation in a fresh Python process, so that no thread pool of another one is around.

NumPy/OpenBLAS, onnxruntime, PyTorch and the TVM runtime each keep a pool of threads that spin for a
while after a call; two of them in one process on a 2-core machine slow each other down. So every
implementation is timed by this file run as a child process::

    python bench/_timing.py KIND PATH INPUTS_NPZ OUT_DIR [--calls N --warmup N --budget-s S ...]

KIND is one of ``tvm`` (PATH: a ``model.so`` exported by TVM, run with ``relax.VirtualMachine``),
``onnxruntime`` (PATH: an ``.onnx`` file), ``openvino`` and ``openvino-fp32`` (PATH: an ``.onnx`` file,
compiled for OpenVINO's CPU plugin with its default inference precision, bf16 on CPUs with AVX512-BF16 or
AMX, or with ``INFERENCE_PRECISION_HINT=f32``), ``torch`` (PATH: an ``.onnx`` file whose weights fill a
hand-written eager module from ``_torch_models.py``), ``torch-module`` (PATH: a ``.pt`` file written by
``_full_models.export``) and ``numpy-matmul`` (PATH unused: ``A @ B`` of the two inputs). INPUTS_NPZ holds the inputs in call order, keyed by input name. The child writes
``OUT_DIR/result.json`` and ``OUT_DIR/outputs.npz``.

Every kind is timed the same way: a ``time.perf_counter`` loop around the one Python call that runs the
model (inputs already converted to the runtime's tensors, outputs left where the runtime put them),
``warmup`` calls first, then the median of ``calls`` calls. A call slower than ``SLOW_CALL_S`` (untuned
TVM on a big matmul takes seconds) gets a single warmup and as many calls as fit in ``budget_s``, but
at least ``min_calls``; the result says how many calls were made.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
KINDS = ("tvm", "onnxruntime", "openvino", "openvino-fp32", "torch", "torch-module", "numpy-matmul")
SLOW_CALL_S = 0.05


@dataclass(frozen=True)
class Reps:
    """How many calls to time."""

    calls: int = 100
    warmup: int = 10
    budget_s: float = 30.0  # only for calls slower than SLOW_CALL_S
    min_calls: int = 5
    rounds: int = 5  # interleaved rounds over all implementations (see ``interleaved``)


#: A smoke test's timing (``--quick``): a few calls, one round.
QUICK_REPS = Reps(calls=20, warmup=3, budget_s=3.0, min_calls=3, rounds=1)


def reps_for(quick: bool, rounds: int | None, full: Reps | None = None) -> Reps:
    """The timing a benchmark's ``--quick`` and ``--rounds`` flags ask for (``full`` without ``--quick``)."""
    reps = QUICK_REPS if quick else (full or Reps())
    return reps if rounds is None else replace(reps, rounds=rounds)


def interleaved(timers: dict[str, Callable[[], dict[str, Any]]], rounds: int) -> dict[str, dict[str, Any]]:
    """Time every implementation ``rounds`` times, round-robin, each time in a fresh process.

    A VM's CPU time varies over seconds (neighbours, frequency); timing A then B once lets such a
    drift land on one of them only. Interleaving spreads it over all, and each implementation's figure
    is its median round (``ms``), with every round's median kept in ``round_ms``. Timers run in the
    dict's order within a round, so a timer may use the result of one before it.
    """
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            results[name].append(timer())
    merged = {}
    for name, runs in results.items():
        ordered = sorted(runs, key=lambda r: r["ms"])
        median_run = dict(ordered[(len(ordered) - 1) // 2])
        median_run["round_ms"] = [r["ms"] for r in runs]
        merged[name] = median_run
    return merged


def physical_cores() -> int:
    """Physical core count (psutil), the thread count given to every runtime."""
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def save_inputs(path: Path, inputs: dict[str, np.ndarray]) -> Path:
    """Write inputs in call order (``np.load(...).files`` keeps the order they were written in)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **inputs)
    return path


def load_outputs(result: dict[str, Any]) -> list[np.ndarray]:
    """The outputs a child run produced, in the model's output order."""
    with np.load(result["outputs_npz"]) as data:
        return [data[k] for k in data.files]


def time_in_fresh_process(
    kind: str,
    path: Path | None,
    inputs_npz: Path,
    reps: Reps | None = None,
    *,
    unset_env: Iterable[str] = (),
    reference_npz: Path | None = None,
    tolerance: float = 1e-4,
    out_dir: Path | None = None,
    timeout_s: float = 1800.0,
) -> dict[str, Any]:
    """Run ``kind`` on the inputs in a new process and return its timing (``ms`` is the median).

    The child gets this environment with ``TVM_NUM_THREADS`` set to the physical core count and the
    variables in ``unset_env`` removed. With ``reference_npz``, the child compares its outputs
    with those and fails before timing when any differs by more than ``tolerance`` (absolute).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    reps = reps or Reps()
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix=f"kiln-bench-{kind}-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TVM_NUM_THREADS=str(physical_cores()))
    unset = [name for name in unset_env if name in env]
    for name in unset:
        del env[name]
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        kind,
        str(path or "-"),
        str(inputs_npz),
        str(out_dir),
        f"--calls={reps.calls}",
        f"--warmup={reps.warmup}",
        f"--budget-s={reps.budget_s}",
        f"--min-calls={reps.min_calls}",
        f"--tolerance={tolerance}",
    ]
    if reference_npz is not None:
        cmd.append(f"--reference={reference_npz}")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"timing child for {kind} {path} failed (exit {proc.returncode}):\n{tail}")
    result = json.loads((out_dir / "result.json").read_text())
    result["env_unset"] = unset
    return result


# --------------------------------------------------------------------------------------------------
# The child


@dataclass(frozen=True)
class Timing:
    """Per-call wall times of one run, in milliseconds."""

    ms: float  # median
    p10_ms: float
    p90_ms: float
    min_ms: float
    calls: int
    warmup: int


def measure(fn: Callable[[], Any], reps: Reps) -> Timing:
    """Median wall time of ``fn()`` after warmup (see the module docstring for slow calls)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    calls, warmup = reps.calls, reps.warmup
    if first > SLOW_CALL_S:
        warmup = 1
        calls = max(reps.min_calls, min(reps.calls, int(reps.budget_s / first)))
    for _ in range(warmup - 1):
        fn()
    times = np.empty(calls)
    for i in range(calls):
        start = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - start
    times *= 1e3
    return Timing(
        ms=float(np.median(times)),
        p10_ms=float(np.percentile(times, 10)),
        p90_ms=float(np.percentile(times, 90)),
        min_ms=float(times.min()),
        calls=calls,
        warmup=warmup,
    )


def _tvm_runner(path: str, inputs: list[np.ndarray]) -> tuple[Callable[[], Any], Callable[[Any], list]]:
    import tvm
    from tvm import relax

    device = tvm.cpu()
    vm = relax.VirtualMachine(tvm.runtime.load_module(path), device)
    # Kiln's artifacts may pre-pack weights: this VM function returns them (as artifact.py's run.py does).
    params = []
    if vm.module.implements_function("main_transform_params"):
        params = list(vm["main_transform_params"]([]))
    args = [tvm.runtime.tensor(x, device) for x in inputs] + params
    main = vm["main"]

    def flatten(out: Any) -> list[np.ndarray]:
        if hasattr(out, "numpy"):
            return [out.numpy()]
        return [a for item in out for a in flatten(item)]

    return (lambda: main(*args)), flatten


def _ort_runner(path: str, names: list[str], inputs: list[np.ndarray]) -> tuple[Callable, Callable]:
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = dict(zip(names, inputs, strict=True))
    return (lambda: session.run(None, feed)), (lambda out: [np.asarray(o) for o in out])


def _openvino_runner(
    path: str, names: list[str], inputs: list[np.ndarray], fp32: bool
) -> tuple[Callable, Callable]:
    import openvino

    core = openvino.Core()
    config = {"INFERENCE_PRECISION_HINT": "f32"} if fp32 else {}
    compiled = core.compile_model(core.read_model(path), "CPU", config)
    request = compiled.create_infer_request()
    feed = dict(zip(names, inputs, strict=True))
    outputs = list(compiled.outputs)
    return (lambda: request.infer(feed)), (lambda out: [np.asarray(out[o]) for o in outputs])


def _torch_runner(
    path: str, inputs: list[np.ndarray], saved_module: bool = False
) -> tuple[Callable, Callable]:
    import _full_models
    import _torch_models
    import torch

    torch.set_num_threads(physical_cores())
    module = _full_models.load(Path(path)) if saved_module else _torch_models.from_onnx(Path(path))
    args = [torch.from_numpy(x) for x in inputs]

    def run() -> Any:
        with torch.inference_mode():
            return module(*args)

    def flatten(out: Any) -> list[np.ndarray]:
        outs = out if isinstance(out, tuple | list) else [out]
        return [o.detach().numpy() for o in outs]

    return run, flatten


def _numpy_runner(inputs: list[np.ndarray]) -> tuple[Callable, Callable]:
    a, b = inputs
    return (lambda: a @ b), (lambda out: [out])


def _runtime_info(kind: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS"),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
    }
    if kind == "tvm":
        import tvm

        info["tvm_version"] = tvm.__version__
        num_threads = getattr(tvm.runtime, "num_threads", None)
        info["tvm_threads"] = int(num_threads()) if num_threads else None
    elif kind == "onnxruntime":
        import onnxruntime

        info["onnxruntime_version"] = onnxruntime.__version__
    elif kind.startswith("openvino"):
        import openvino

        info["openvino_version"] = openvino.__version__
        precision = openvino.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
        info["inference_precision"] = precision.to_string() if kind == "openvino" else "f32"
    elif kind.startswith("torch"):
        import torch

        info["torch_version"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    else:
        info["numpy_version"] = np.__version__
    try:
        from threadpoolctl import threadpool_info

        info["threadpools"] = [
            {k: p.get(k) for k in ("user_api", "internal_api", "num_threads", "version", "architecture")}
            for p in threadpool_info()
        ]
    except ImportError:
        info["threadpools"] = "threadpoolctl is not installed"
    return info


def _child(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("path")
    parser.add_argument("inputs_npz", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--calls", type=int, default=Reps.calls)
    parser.add_argument("--warmup", type=int, default=Reps.warmup)
    parser.add_argument("--budget-s", type=float, default=Reps.budget_s)
    parser.add_argument("--min-calls", type=int, default=Reps.min_calls)
    parser.add_argument("--reference", type=Path, default=None)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args(argv)

    with np.load(args.inputs_npz) as data:
        names = list(data.files)
        inputs = [data[n] for n in names]
    setup_start = time.perf_counter()
    if args.kind == "tvm":
        run, to_numpy = _tvm_runner(args.path, inputs)
    elif args.kind == "onnxruntime":
        run, to_numpy = _ort_runner(args.path, names, inputs)
    elif args.kind in ("openvino", "openvino-fp32"):
        run, to_numpy = _openvino_runner(args.path, names, inputs, fp32=args.kind == "openvino-fp32")
    elif args.kind in ("torch", "torch-module"):
        run, to_numpy = _torch_runner(args.path, inputs, saved_module=args.kind == "torch-module")
    else:
        run, to_numpy = _numpy_runner(inputs)
    outputs = to_numpy(run())
    setup_s = time.perf_counter() - setup_start

    max_abs_error = None
    if args.reference is not None:
        with np.load(args.reference) as data:
            expected = [data[k] for k in data.files]
        max_abs_error = max(float(np.abs(o - e).max()) for o, e in zip(outputs, expected, strict=True))
        if not max_abs_error <= args.tolerance:
            sys.exit(
                f"{args.kind}: outputs differ from {args.reference} by {max_abs_error:.3g} > {args.tolerance}"
            )

    reps = Reps(args.calls, args.warmup, args.budget_s, args.min_calls)
    timing = measure(run, reps)
    np.savez(args.out_dir / "outputs.npz", *outputs)
    result = {
        "kind": args.kind,
        "path": args.path,
        **asdict(timing),
        "setup_s": setup_s,
        "max_abs_error_vs_reference": max_abs_error,
        "outputs_npz": str(args.out_dir / "outputs.npz"),
        "runtime": _runtime_info(args.kind),
    }
    (args.out_dir / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    _child(sys.argv[1:])
