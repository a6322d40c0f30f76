"""Profiled runs of a compiled model and of onnxruntime, call by call (run in a fresh timing process of
:mod:`tuner.timing.side_by_side`, like every figure Kiln reports).

* **Kiln**: the Relax VM calls an instrument before each of its Call instructions, with the function and
  its arguments. Each kernel is timed **in place**: in one run of the model, just before its own call,
  TVM's ``time_evaluator`` runs it on the very tensors it gets (the median of a few repeats, timed in C++:
  no Python between the calls, and its inputs as warm in the caches as its producer left them), in two
  passes, the lower of each call's two times kept. Before, between and after them the same process times
  the model's run, uninstrumented, in short windows (the lowest window's median kept); the run less its
  kernels is the VM's own work (allocation, shape checks, the calls themselves) and what running in
  sequence costs the kernels (caches their producer did not warm for them, threads to wake). Timing every
  call from Python around it instead added 1-2 µs of argument conversion per call, more than most
  builtins take, and varied by 2x from one process to the next on a 2-core VM (a small CNN's profile:
  235-466 µs so, 222-245 µs in place). Arguments are sized once (their total is the bytes a kernel moves
  at the least).
* **onnxruntime**: its own profiler (``enable_profiling``) writes one event per node per run; the same
  medians are taken per node, in the order the nodes ran.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from collections import defaultdict
from typing import Any

import numpy as np

from tuner.timing.calls import median_call_ms

#: onnxruntime's runs profiled after the warm-up runs: at least MIN_RUNS, at most MAX_RUNS, within the
#: budget.
MIN_RUNS = 5
MAX_RUNS = 50
WARMUP_RUNS = 2
#: The prefix of the VM's own functions among the calls (its builtins); every other call is a kernel.
RUNTIME_PREFIX = "vm."
#: Windows the model's run is timed in: a third before, between and after the two in-place passes.
RUN_WINDOWS = 6
#: Repeats of each kernel timed in place, and the bounds on one repeat's time.
_REPEATS = 5
_MIN_REPEAT_MS = 1.0
_MAX_REPEAT_MS = 20.0
#: The instrument's return value that lets the VM go on as usual (VMInstrumentReturnKind.kNoOp).
_NO_OP = 0


def _bytes_of(value: Any) -> int:
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None or not hasattr(dtype, "bits"):
        return 0
    return math.prod(int(d) for d in shape) * int(dtype.bits) * int(getattr(dtype, "lanes", 1)) // 8


def _run_count(run: Any, budget_s: float) -> int:
    """Profiled runs that fit ``budget_s``, from one timed run."""
    start = time.perf_counter()
    run()
    once = max(time.perf_counter() - start, 1e-6)
    return max(MIN_RUNS, min(MAX_RUNS, int(budget_s / once)))


def tvm_kernel_calls(path: str, inputs: list[np.ndarray], budget_s: float) -> dict[str, Any]:
    """Every call of one run of the compiled model at ``path``: its function's name, the bytes of its
    arguments and, for a kernel, its time (µs) timed in place (the lower of two passes); and the median of
    the model's runs (µs), uninstrumented, in ``RUN_WINDOWS`` windows around the passes that take about a
    third of ``budget_s`` together (the lowest window's)."""
    from kiln_tvm import tvm
    from tuner.compile import LoadedModel

    lib = tvm.runtime.load_module(path)
    model = LoadedModel(lib)
    call = model.bound_call(inputs)
    for _ in range(WARMUP_RUNS):
        call()

    names: list[str] = []
    sizes: list[int] = []

    def listing(func: Any, symbol: str, before: bool, ret: Any, *args: Any) -> int:
        if before:
            names.append(str(symbol))
            sizes.append(sum(_bytes_of(a) for a in args))
        return _NO_OP

    model.vm.set_instrument(listing)
    call()
    model.vm.set_instrument(None)
    kernels = sum(not n.startswith(RUNTIME_PREFIX) for n in names)
    # Two in-place passes, each call's time the lower of its two:
    # a burst of other work on a 2-core machine (seen once: half the kernels of a ResNet-18 timed at one
    # thread's speed for a second) then costs one pass, not the profile.
    repeat_ms = min(_MAX_REPEAT_MS, max(_MIN_REPEAT_MS, budget_s * 1e3 / 3 / _REPEATS / max(kernels, 1)))
    # The run is timed in RUN_WINDOWS short windows spread around the passes, its figure the lowest
    # window's median: on a 2-core VM the same model's run is slowed by a third to a half for a second at
    # a time (seen: 0.77 ms in one window, 1.36 ms in the next, nothing else running), and a burst then
    # costs the windows it overlaps, not the profile.
    window_s = budget_s / 3 / RUN_WINDOWS

    def timed_windows() -> list[tuple[float, int]]:
        return [median_call_ms(call, window_s) for _ in range(RUN_WINDOWS // 3)]

    windows = timed_windows()
    passes = []
    for _ in range(2):  # windows, a pass, windows, a pass, windows
        in_place = _InPlaceTimer(tvm, lib, repeat_ms)
        model.vm.set_instrument(in_place)
        call()
        model.vm.set_instrument(None)
        passes.append(in_place.times)
        windows += timed_windows()
    run_ms, runs = min(ms for ms, _ in windows), sum(count for _, count in windows)
    times = iter(min(pair) for pair in zip(*passes, strict=True))
    return {
        "runs": runs,
        "run_us": run_ms * 1e3,
        "calls": [
            {"name": name, "bytes": size, "us": None if name.startswith(RUNTIME_PREFIX) else next(times)}
            for name, size in zip(names, sizes, strict=True)
        ],
    }


class _InPlaceTimer:
    """A VM instrument that times each kernel where the model calls it, on the very arguments it gets:
    TVM's ``time_evaluator`` runs it ``_REPEATS`` x about ``repeat_ms`` before the model's own call."""

    def __init__(self, tvm: Any, lib: Any, repeat_ms: float) -> None:
        self.tvm = tvm
        self.modules = [lib, *lib.imports]
        self.repeat_ms = repeat_ms
        self.timers: dict[str, Any] = {}
        self.times: list[float] = []

    def _timer(self, symbol: str) -> Any:
        if symbol not in self.timers:
            module = next(m for m in self.modules if m.implements_function(symbol))
            self.timers[symbol] = module.time_evaluator(
                symbol, self.tvm.cpu(), number=1, repeat=_REPEATS, min_repeat_ms=round(self.repeat_ms)
            )
        return self.timers[symbol]

    def __call__(self, func: Any, symbol: str, before: bool, ret: Any, *args: Any) -> int:
        if before and not symbol.startswith(RUNTIME_PREFIX):
            results = self._timer(str(symbol))(*args).results
            self.times.append(statistics.median(results) * 1e6)
        return _NO_OP


def onnxruntime_node_times(path: str, inputs: list[np.ndarray], budget_s: float) -> dict[str, Any]:
    """onnxruntime's profile of the ONNX model at ``path``: its nodes in the order they ran, each with its
    operator and its median time over the profiled runs (µs), and its median run."""
    import onnxruntime

    with tempfile.TemporaryDirectory(prefix="kiln-ort-profile-") as tmp:
        options = onnxruntime.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "ort")
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        feed = {arg.name: x for arg, x in zip(session.get_inputs(), inputs, strict=True)}

        def call() -> Any:
            return session.run(None, feed)

        for _ in range(WARMUP_RUNS):
            call()
        runs = _run_count(call, budget_s)
        for _ in range(runs):
            call()
        with open(session.end_profiling()) as f:
            events = json.load(f)
    return onnxruntime_profile_summary(events, skip_runs=WARMUP_RUNS + 1)


def onnxruntime_profile_summary(events: list[dict[str, Any]], skip_runs: int = 0) -> dict[str, Any]:
    """Per node of onnxruntime's profiler events (its JSON), the median over the runs after the first
    ``skip_runs`` of the node's kernel time, in the order of the nodes' first run kept."""
    model_runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e["ts"],
    )[skip_runs:]
    per_node: dict[str, list[float]] = defaultdict(list)
    ops: dict[str, str] = {}
    flops: dict[str, float | None] = {}
    order: list[str] = []
    for event in sorted((e for e in events if e.get("cat") == "Node"), key=lambda e: e["ts"]):
        name = str(event.get("name", ""))
        if not name.endswith("_kernel_time"):
            continue
        ts = event["ts"]
        if not any(run["ts"] <= ts <= run["ts"] + run["dur"] for run in model_runs):
            continue
        node = name.removesuffix("_kernel_time")
        if node not in ops:
            order.append(node)
            ops[node] = str(event.get("args", {}).get("op_name", ""))
            flops[node] = node_flops(ops[node], event.get("args", {}))
        per_node[node].append(float(event["dur"]))
    return {
        "runs": len(model_runs),
        "run_us": statistics.median(float(r["dur"]) for r in model_runs) if model_runs else None,
        "nodes": [
            {"name": n, "op": ops[n], "us": statistics.median(per_node[n]), "flops": flops[n]} for n in order
        ],
    }


def _shapes(entries: Any) -> list[list[int]]:
    """The shapes of onnxruntime's ``input_type_shape`` / ``output_type_shape`` (``[{"float": [1, 3]}]``)."""
    shapes = []
    for entry in entries or []:
        for dims in entry.values() if isinstance(entry, dict) else ():
            shapes.append([int(d) for d in dims])
    return shapes


def node_flops(op: str, args: dict[str, Any]) -> float | None:
    """2 x the multiply-adds of a convolution or matrix product from the shapes onnxruntime recorded
    (None for other operators, or when the shapes are missing)."""
    inputs, outputs = _shapes(args.get("input_type_shape")), _shapes(args.get("output_type_shape"))
    if not inputs or not outputs or len(inputs) < 2:
        return None
    out = math.prod(outputs[0])
    weight = inputs[3] if op == "QLinearConv" and len(inputs) > 3 else inputs[1]
    if "Conv" in op and len(weight) >= 3:
        return 2.0 * out * math.prod(weight[1:])  # weight (M, C/group, k...): C/group x k... per output
    if ("MatMul" in op or "Gemm" in op) and inputs[0]:
        return 2.0 * out * inputs[0][-1]
    return None
