"""The timing children: each times a compiled model (or onnxruntime), profiles it, or measures this
machine's limits, in a process of its own forked from ``python -m tuner.timing.timing_child --fork-server
FD`` (which has imported TVM and, when installed, onnxruntime, and run nothing). A child reads ``[KIND,
ARGS...]`` as JSON on stdin (:func:`request_result`) and prints one JSON line; the parent side is
:func:`tuner.timing.side_by_side.run_child`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from tuner.timing.calls import BUDGET_S, median_call_ms

#: The kinds of request that time a callable.
KINDS = ("tvm", "onnxruntime")


def _tvm_call(path: str, inputs: list[np.ndarray]) -> Callable[[], Any]:
    from kiln_tvm import tvm
    from tuner.compile import LoadedModel

    return LoadedModel(tvm.runtime.load_module(path)).bound_call(inputs)


def _onnxruntime_call(path: str, inputs: list[np.ndarray]) -> Callable[[], Any]:
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = {arg.name: x for arg, x in zip(session.get_inputs(), inputs, strict=True)}
    return lambda: session.run(None, feed)


def _answer(kind: str, *args: str) -> None:
    result = request_result(kind, *args)
    if kind in KINDS:
        # A timing's CPU time, all its threads (a forked child's count starts at zero): the fork server, not
        # the caller, is its parent, so the caller's busy check cannot count it as its own any other way.
        times = os.times()
        result["cpu_s"] = times.user + times.system
    print(json.dumps(result))


def request_result(kind: str, *args: str) -> dict[str, Any]:
    """What one child computes: a timing (``tvm``, ``onnxruntime``), a profile (``tvm-profile``,
    ``onnxruntime-profile``; :mod:`tuner.timing.profile_runs`) or this machine's limits (``limits``)."""
    if kind == "limits":
        from tuner.timing.roofline import measure_limits

        return measure_limits(json.loads(args[0])).as_dict()
    path, inputs_npz, budget_s = args[0], args[1], float(args[2]) if len(args) > 2 else BUDGET_S
    with np.load(inputs_npz) as data:
        inputs = [data[f"arg{i}"] for i in range(len(data.files))]
    if kind == "tvm-profile":
        from tuner.timing.profile_runs import tvm_kernel_calls

        return tvm_kernel_calls(path, inputs, budget_s)
    if kind == "onnxruntime-profile":
        from tuner.timing.profile_runs import onnxruntime_node_times

        return onnxruntime_node_times(path, inputs, budget_s)
    call = _tvm_call(path, inputs) if kind == "tvm" else _onnxruntime_call(path, inputs)
    median_ms, calls = median_call_ms(call, budget_s)
    return {"kind": kind, "median_ms": median_ms, "calls": calls}


def warm_up() -> None:
    import tuner.compile  # noqa: F401 - TVM and Kiln's loader
    from kiln_tvm import tvm  # noqa: F401

    # onnxruntime is a peer, not a part of Kiln: where it is missing the job measures without it and says
    # so (tuner.timing.verify.onnxruntime_model), and the children must still start.
    with contextlib.suppress(ImportError):
        import onnxruntime  # noqa: F401


def serve_one() -> None:
    """One timing child: its request as JSON on stdin, its answer as one JSON line on stdout."""
    try:
        _answer(*json.loads(sys.stdin.read()))
    except BaseException as exc:  # noqa: BLE001 - reported on stderr with a failing exit code
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    """``python -m tuner.timing.timing_child --fork-server FD``: the fork server of timing children."""
    from forkserver import serve_main

    serve_main("tuner.timing.timing_child", warm_up, serve_one)


if __name__ == "__main__":
    main()
