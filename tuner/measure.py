"""End-to-end latency of a compiled model (or of onnxruntime), timed in a fresh process.

Thread pools of different runtimes (TVM, onnxruntime, XGBoost in the tuning process) keep spinning for
a while after a call and slow each other down on a machine with few cores, so every figure Kiln reports
is measured by this module run as a child process::

    python -m tuner.measure KIND PATH INPUTS_NPZ

KIND is ``tvm`` (PATH: a library exported by ``export_library``) or ``onnxruntime`` (PATH: an ONNX
file). Both are timed the same way: a ``perf_counter`` loop around the call, after warm-up, median of up
to ``MAX_CALLS`` calls within ``BUDGET_S`` seconds (at least ``MIN_CALLS``). It prints one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

MAX_CALLS = 200
MIN_CALLS = 5
BUDGET_S = 3.0
KINDS = ("tvm", "onnxruntime")


def median_call_ms(call: Callable[[], Any]) -> tuple[float, int]:
    """Median wall time of ``call`` in ms, and how many timed calls it took."""
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    for _ in range(0 if first > 0.05 else 10):
        call()
    times: list[float] = []
    deadline = time.perf_counter() + BUDGET_S
    while len(times) < MIN_CALLS or (len(times) < MAX_CALLS and time.perf_counter() < deadline):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3, len(times)


def _tvm_call(path: str, inputs: list[np.ndarray]) -> Callable[[], Any]:
    from kiln_tvm import tvm
    from tuner.compile import LoadedModel

    return LoadedModel(tvm.runtime.load_module(path)).bound_call(inputs)


def _onnxruntime_call(path: str, inputs: list[np.ndarray]) -> Callable[[], Any]:
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = {arg.name: x for arg, x in zip(session.get_inputs(), inputs, strict=True)}
    return lambda: session.run(None, feed)


def _child(kind: str, path: str, inputs_npz: str) -> None:
    with np.load(inputs_npz) as data:
        inputs = [data[f"arg{i}"] for i in range(len(data.files))]
    call = _tvm_call(path, inputs) if kind == "tvm" else _onnxruntime_call(path, inputs)
    median_ms, calls = median_call_ms(call)
    print(json.dumps({"kind": kind, "median_ms": median_ms, "calls": calls}))


def latency_in_fresh_process(
    kind: str, path: Path, inputs: list[np.ndarray], timeout_s: float = 600
) -> float:
    """Median end-to-end latency in ms of the model at ``path``, timed in a new Python process."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    with tempfile.TemporaryDirectory(prefix="kiln-measure-") as tmp:
        npz = Path(tmp) / "inputs.npz"
        np.savez(npz, **{f"arg{i}": x for i, x in enumerate(inputs)})
        done = subprocess.run(
            [sys.executable, "-m", "tuner.measure", kind, str(path), str(npz)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    if done.returncode != 0:
        raise RuntimeError(f"timing {kind} {path.name} failed: {done.stderr.strip()[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["median_ms"])


if __name__ == "__main__":
    _child(*sys.argv[1:4])
