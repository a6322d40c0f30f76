"""End-to-end latency of a compiled model (or of onnxruntime), timed in fresh processes, side by side.

Thread pools of different runtimes (TVM, onnxruntime, XGBoost in the tuning process) keep spinning for
a while after a call and slow each other down on a machine with few cores, so every figure Kiln reports
is measured in a child process of its own, forked from the fork server of :mod:`tuner.timing.timing_child`
(which has imported TVM and, when installed, onnxruntime, and run nothing: no runtime's threads exist
before the fork, and a child does not pay the seconds of loading them). A child reads ``[KIND, PATH, INPUTS_NPZ, BUDGET_S]``
as JSON on stdin (:func:`run_child`; the same children profile a model and measure the machine's
limits). KIND is ``tvm`` (PATH: a library exported by ``export_library``) or ``onnxruntime`` (PATH: an
ONNX file). Both are timed the same way, by :func:`tuner.timing.calls.median_call_ms`. It prints one JSON
line.

:func:`interleaved_timings` times several implementations in rounds, each round running every one of
them once in its own fresh process, in a rotated order: a transient load on the machine then shows as
rounds that disagree instead of skewing one implementation's only figure. It also measures how much of
the CPUs other processes used meanwhile, and says so when the figures may be off.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from forkserver import shared_fork_server
from tuner.entities import LatencyReport, Timing
from tuner.timing.calls import BUDGET_S
from tuner.timing.cpu_share import BUSY_CPU_SHARE, OtherCpuSampler

#: Rounds of one implementation that differ by more than this (max - min over median): a warning.
DISAGREEING_SPREAD = 0.25


def run_child(request: list[str], timeout_s: float = 600) -> dict[str, Any]:
    """Run one request (``[KIND, ARGS...]``, see :func:`tuner.timing.timing_child.request_result`) in a
    fresh process forked from the timing children's fork server (:mod:`tuner.timing.timing_child`), and
    return what it printed; :class:`RuntimeError` when it fails or outlives ``timeout_s``."""
    what = request[0] if request[0] == "limits" else " ".join(Path(a).name for a in request[:2])
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        stdin_r, stdin_w = os.pipe()
        try:
            child = shared_fork_server("tuner.timing.timing_child").spawn(
                [stdin_r, out.fileno(), err.fileno()]
            )
        finally:
            os.close(stdin_r)
        with os.fdopen(stdin_w, "w") as stdin:
            stdin.write(json.dumps(request))
        try:
            returncode = child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise RuntimeError(f"{what} took longer than {timeout_s:g} s") from None
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if returncode != 0:
        raise RuntimeError(f"{what} failed: {stderr.strip()[-2000:]}")
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def _time_in_child(
    kind: str, path: Path, npz: Path, timeout_s: float, budget_s: float
) -> tuple[float, float]:
    """The median call in ms, and the CPU seconds the child used."""
    try:
        result = run_child([kind, str(path), str(npz), str(budget_s)], timeout_s)
    except RuntimeError as exc:
        raise RuntimeError(f"timing {exc}") from None
    return float(result["median_ms"]), float(result.get("cpu_s", 0.0))


def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """The order of each round: rotated by one each time, so that no implementation always runs first."""
    n = len(names)
    return [names[r % n :] + names[: r % n] for r in range(rounds)] if n else []


def interleaved_timings(
    contenders: Mapping[str, tuple[str, Path]],
    inputs: list[np.ndarray],
    rounds: int = 3,
    timeout_s: float = 600,
) -> LatencyReport:
    """Time every contender (name -> (kind, path)) in ``rounds`` interleaved rounds of fresh processes.

    Each round gives each contender ``BUDGET_S / rounds`` seconds of calls, so the total timing stays
    that of one ``BUDGET_S`` measurement per contender.
    """
    if rounds < 1:
        raise ValueError("at least one round")
    budget_s = BUDGET_S / rounds
    measured: dict[str, list[float]] = {name: [] for name in contenders}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    # Up before the sampler starts: its seconds of loading TVM and onnxruntime, once per process, are Kiln's.
    shared_fork_server("tuner.timing.timing_child").start()
    sampler = OtherCpuSampler()
    children_cpu_s = 0.0
    with tempfile.TemporaryDirectory(prefix="kiln-measure-") as tmp:
        npz = Path(tmp) / "inputs.npz"
        np.savez(npz, **{f"arg{i}": x for i, x in enumerate(inputs)})
        for order in round_orders(list(contenders), rounds):
            for name in order:
                kind, path = contenders[name]
                median_ms, cpu_s = _time_in_child(kind, path, npz, timeout_s, budget_s)
                measured[name].append(median_ms)
                children_cpu_s += cpu_s
    other = sampler.share(children_cpu_s)
    timings = {name: Timing(tuple(values)) for name, values in measured.items()}
    return LatencyReport(
        timings=timings, warnings=busy_warnings(timings, other), other_cpu_share=other, load_average=load
    )


def busy_warnings(timings: Mapping[str, Timing], other_cpu_share: float | None) -> tuple[str, ...]:
    """What a reader of these figures should know: other processes were busy, or rounds disagree."""
    warnings = []
    if other_cpu_share is not None and other_cpu_share > BUSY_CPU_SHARE:
        warnings.append(
            f"the machine was busy: other processes used {100 * other_cpu_share:.0f} % of the CPUs while "
            "Kiln timed the model, so these figures may be off; time the artifact again on an idle machine"
        )
    for name, t in timings.items():
        if len(t.rounds_ms) > 1 and t.spread > DISAGREEING_SPREAD:
            warnings.append(
                f"the rounds of {name} disagree by {100 * t.spread:.0f} % ({t.min_ms:.3f} to {t.max_ms:.3f} ms): "
                "something else probably ran meanwhile"
            )
    return tuple(warnings)
