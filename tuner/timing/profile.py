"""A compiled model's profile, kernel by kernel: calls, time, share, GFLOP/s and bytes moved, placed under
the machine's roofline, and beside onnxruntime's own profile of the same ONNX model where it can run.

The runs happen in fresh processes (:mod:`tuner.timing.profile_runs` through :mod:`tuner.timing.side_by_side`); this module
adds what the TIR says (each kernel's FLOPs), matches onnxruntime's nodes (:mod:`tuner.timing.profile_match`)
and builds the :class:`~tuner.entities.ModelProfile` a job keeps.
"""

from __future__ import annotations

import json
import logging
import socket
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from kiln_tvm import estimate_flops, tvm
from schedules.anatomy import kernel_precision
from tuner.entities import KernelProfile, MachineLimits, ModelProfile, OnnxruntimeNode
from tuner.entities.profile import LIMITS_VERSION
from tuner.errors import Conflict
from tuner.store.sql import Store
from tuner.targets import canonical_target_key
from tuner.timing.profile_match import KilnCall, OrtNode, match_nodes
from tuner.timing.profile_runs import RUN_WINDOWS, RUNTIME_PREFIX
from tuner.timing.side_by_side import run_child

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The name of the profile's row for the rest of the run: the model's run less its kernels timed in place,
#: i.e. the VM's own work (allocation, shape checks, reshapes, the calls) and what running in sequence
#: costs the kernels (caches their producer did not warm, threads to wake); its calls: the VM's builtins.
RUNTIME_ROW = "VM runtime (the rest of the run)"
#: Kernels and run that disagree by more than this share of the run: the profile is taken again, in a
#: fresh process (at most PROFILE_TRIES in all). On the 2-core VM a model's run slows by half for seconds
#: at a time with nothing else running (the same artifact: 0.76 ms, then 1.2 ms for a whole process), and
#: a profile taken then has its kernels, each timed in place, account for 75 % of the run.
PROFILE_AGREEMENT = 0.10
PROFILE_TRIES = 3
#: Measurements of this machine's limits at most, while each was disturbed by other processes (a machine
#: always busy, e.g. with two workers on two cores, then stops paying ~10 s a job for figures no better).
LIMIT_MEASUREMENTS = 3
HOW = (
    "Kiln: each kernel timed in place, on the tensors it gets in a run of the compiled model (TVM's "
    "time_evaluator just before its call; median of 5 repeats, the lower of two passes); the rest of the "
    "run (the VM's own work, and what running in sequence costs the kernels) is the model's run "
    f"(uninstrumented, in the same process: the lowest median of {RUN_WINDOWS} short windows around the "
    f"passes) less its kernels; taken again in a fresh process, up to {PROFILE_TRIES} times, while the two "
    f"disagree by more than {100 * PROFILE_AGREEMENT:.0f} %, the nearest kept. FLOPs from each kernel's "
    "TIR; bytes = its argument tensors (each read or written once: the least it can move; a kernel whose "
    "data stays in the caches can run above the memory roof). onnxruntime: its own profiler "
    "(enable_profiling), median per node. The roofline: this machine's measured fp32 FMA peak and STREAM "
    "triad bandwidth (kiln machine)."
)


def kernel_flops(mod: tvm.IRModule) -> dict[str, float]:
    """FLOPs of each TIR function of ``mod`` by name, as TVM estimates them (those it cannot, left out)."""
    flops = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            value = estimate_flops(tvm.IRModule({"main": func}))
            if value > 0:
                flops[gvar.name_hint] = value
    return flops


def kernel_precisions(mod: tvm.IRModule) -> dict[str, str]:
    """What each TIR function of ``mod`` computes in, by name (:func:`schedules.anatomy.kernel_precision`;
    those of no precision of their own, left out)."""
    return {
        gvar.name_hint: precision
        for gvar, func in mod.functions.items()
        if isinstance(func, tvm.tirx.PrimFunc) and (precision := kernel_precision(func)) is not None
    }


def _planned_for_kernel(name: str, flops: Mapping[str, T]) -> T | None:
    """A called kernel's FLOPs (or other planned figure): its own name's, else the longest planned name it
    extends (weight prepacking renames a kernel it splits, e.g. ``fused_conv2d_add`` to
    ``fused_conv2d_add_prepacked``)."""
    if name in flops:
        return flops[name]
    prefixes = [k for k in flops if name.startswith(k)]
    return flops[max(prefixes, key=len)] if prefixes else None


def build_profile(
    kiln: dict[str, Any],
    flops: dict[str, float],
    *,
    onnxruntime: dict[str, Any] | None = None,
    onnxruntime_note: str = "",
    latency_ms: float | None = None,
    limits: MachineLimits | None = None,
    onnxruntime_latency_ms: float | None = None,
    precisions: Mapping[str, str] | None = None,
) -> ModelProfile:
    """The profile of one model from its profiled calls (:func:`tuner.timing.profile_runs.tvm_kernel_calls`),
    its kernels' FLOPs and, optionally, onnxruntime's profile
    (:func:`tuner.timing.profile_runs.onnxruntime_node_times`)."""
    calls = kiln["calls"]
    kernel_calls = _kernel_calls(calls)
    kernels_us = sum(c["us"] for c in kernel_calls)
    builtins = len(calls) - len(kernel_calls)
    # The VM's own work is the run's time outside the kernels (none when the kernels, timed in place,
    # took longer than the whole run).
    run_us = kiln.get("run_us")
    runtime_us = max(0.0, run_us - kernels_us) if run_us else 0.0
    total_us = kernels_us + runtime_us
    order: list[str] = []
    times: dict[str, list[float]] = defaultdict(list)
    sizes: dict[str, list[int]] = defaultdict(list)
    for c in kernel_calls:
        if c["name"] not in times:
            order.append(c["name"])
        times[c["name"]].append(c["us"])
        sizes[c["name"]].append(c["bytes"])

    ort_us: dict[str, float] = defaultdict(float)
    ort_names: dict[str, list[str]] = defaultdict(list)
    ort_calls: dict[str, set[int]] = defaultdict(set)
    nodes: tuple[OnnxruntimeNode, ...] = ()
    if onnxruntime is not None:
        kiln_calls = [KilnCall(c["name"], _planned_for_kernel(c["name"], flops)) for c in kernel_calls]
        ort_nodes = [OrtNode(n["name"], n["op"], n["us"], n.get("flops")) for n in onnxruntime["nodes"]]
        matches = match_nodes(kiln_calls, ort_nodes)
        matched_nodes = []
        for node, index in zip(ort_nodes, matches, strict=True):
            kernel = kiln_calls[index].kernel if index is not None else None
            if kernel is not None:
                ort_us[kernel] += node.us
                ort_names[kernel].append(node.name)
                ort_calls[kernel].add(index)  # type: ignore[arg-type]
            matched_nodes.append(OnnxruntimeNode(node.name, node.op, node.us, kernel))
        nodes = tuple(matched_nodes)

    rows = [
        KernelProfile(
            name=name,
            kind="kernel",
            calls=len(times[name]),
            total_us=sum(times[name]),
            share=sum(times[name]) / total_us if total_us > 0 else 0.0,
            flops=_planned_for_kernel(name, flops),
            bytes=int(np.mean(sizes[name])) or None,
            onnxruntime_us=ort_us.get(name),
            onnxruntime_nodes=tuple(ort_names.get(name, ())),
            matched_calls=len(ort_calls.get(name, ())),
            precision=_planned_for_kernel(name, precisions or {}),
        )
        for name in order
    ]
    if builtins or runtime_us:
        share = runtime_us / total_us if total_us > 0 else 0.0
        rows.append(KernelProfile(RUNTIME_ROW, "runtime", builtins, runtime_us, share))
    rows.sort(key=lambda k: k.total_us, reverse=True)
    return ModelProfile(
        kernels=tuple(rows),
        runs=int(kiln["runs"]),
        total_us=total_us,
        latency_ms=latency_ms,
        run_us=run_us,
        limits=limits,
        onnxruntime_nodes=nodes,
        onnxruntime_total_us=onnxruntime.get("run_us") if onnxruntime else None,
        onnxruntime_latency_ms=onnxruntime_latency_ms if onnxruntime else None,
        onnxruntime_note=onnxruntime_note,
        how=HOW,
    )


def profile_model(
    tuned_lib: Path,
    flops: dict[str, float],
    inputs: list[np.ndarray],
    *,
    work_dir: Path,
    onnx_file: Path | None = None,
    onnxruntime_note: str = "",
    latency_ms: float | None = None,
    limits: MachineLimits | None = None,
    budget_s: float = 2.0,
    onnxruntime_latency_ms: float | None = None,
    precisions: Mapping[str, str] | None = None,
) -> ModelProfile:
    """Profile the compiled model at ``tuned_lib`` (and onnxruntime on ``onnx_file`` when given), each in a
    fresh process for about ``budget_s`` seconds of runs, on ``inputs``."""
    npz = work_dir / "profile-inputs.npz"
    np.savez(npz, **{f"arg{i}": x for i, x in enumerate(inputs)})
    budget = str(budget_s)
    kiln = _consistent_profile(["tvm-profile", str(tuned_lib), str(npz), budget])
    onnxruntime = None
    if onnx_file is not None:
        try:
            onnxruntime = run_child(["onnxruntime-profile", str(onnx_file), str(npz), budget])
        except RuntimeError as exc:  # Kiln's own profile stands without it; say why it is missing
            log.warning("onnxruntime's profile failed: %s", exc)
            onnxruntime_note = f"onnxruntime's profile failed: {str(exc)[:300]}"
    return build_profile(
        kiln,
        flops,
        onnxruntime=onnxruntime,
        onnxruntime_note=onnxruntime_note,
        latency_ms=latency_ms,
        limits=limits,
        onnxruntime_latency_ms=onnxruntime_latency_ms,
        precisions=precisions,
    )


def _consistent_profile(request: list[str]) -> dict[str, Any]:
    """Kiln's profiled calls (:func:`tuner.timing.profile_runs.tvm_kernel_calls`) in a fresh process, taken again
    in another while its kernels and its run disagree by more than :data:`PROFILE_AGREEMENT` of the run (at
    most :data:`PROFILE_TRIES` in all); the attempt whose kernels come nearest the run is kept."""
    attempts = []
    for _ in range(PROFILE_TRIES):
        kiln = run_child(request)
        disagreement = _disagreement(kiln)
        attempts.append((disagreement, kiln))
        if disagreement <= PROFILE_AGREEMENT:
            break
        log.info("profile retaken: its kernels and its run disagree by %.0f %%", 100 * disagreement)
    return min(attempts, key=lambda attempt: attempt[0])[1]


def _disagreement(kiln: dict[str, Any]) -> float:
    run_us = float(kiln.get("run_us") or 0.0)
    kernels_us = sum(float(c["us"]) for c in _kernel_calls(kiln.get("calls", [])))
    return abs(kernels_us - run_us) / run_us if run_us > 0 else float("inf")


def _kernel_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kernels among a profile's calls (the VM's builtins left out)."""
    return [c for c in calls if not c["name"].startswith(RUNTIME_PREFIX)]


def host_key(target: dict[str, Any]) -> str:
    """The key this machine's limits for ``target`` are cached under: its host name and the target."""
    return f"{socket.gethostname()} {canonical_target_key(target)}"


def measure_host_limits(target: dict[str, Any]) -> MachineLimits:
    """Measure this machine's roofs for a host CPU ``target`` in a fresh process (no other runtime's
    threads compete with the benchmark)."""
    measured = run_child(["limits", json.dumps(target)], timeout_s=300)
    return MachineLimits(**measured)


def host_limits(
    store: Store,
    target: dict[str, Any],
    measure: Callable[[dict[str, Any]], MachineLimits] = measure_host_limits,
) -> MachineLimits:
    """This machine's roofs for ``target``: as measured here before (kept in the store per host), else
    measured now and kept. Limits measured while other processes kept the machine busy are measured again
    by the next callers, up to :data:`LIMIT_MEASUREMENTS` times in all, each figure kept at its best."""
    key = host_key(target)
    cached = store.get_machine_limits(key)
    if cached is not None and cached.version < LIMITS_VERSION:
        log.info(
            "this machine's limits were kept by an older Kiln, without its int8 and bf16 peaks: measured again"
        )
        cached = None  # replaced, not merged: its figures were not the same set
    if cached is not None and (not cached.disturbed or cached.measurements >= LIMIT_MEASUREMENTS):
        return cached
    measured = measure(target)
    if cached is not None:
        log.info("this machine's limits were measured while it was busy: measured again")
        return store.save_machine_limits(key, cached.best_of(measured))
    try:
        return store.save_machine_limits(key, measured)
    except Conflict:  # another worker on this host measured and kept its figures first: those stand
        return store.get_machine_limits(key) or measured
