"""A compiled model's profile: onnxruntime's profiler JSON summarised per node, its nodes matched to Kiln's
kernel calls, the rows built and placed under the roofline, the profile and the machine's limits kept in
the store, a real compiled model profiled call by call, and a profile whose kernels and run disagree
taken again."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from tests.model_builders import build_small_cnn
from tests.store_rows import add_job
from tuner.compile import build_untuned, random_inputs
from tuner.entities import KernelProfile, MachineLimits, ModelProfile
from tuner.entities.profile import LIMITS_VERSION
from tuner.errors import NotFound
from tuner.frontend import load_model
from tuner.jobs.artifact import export_library
from tuner.store import Store
from tuner.targets import host_target, to_tvm_target
from tuner.timing.profile import (
    LIMIT_MEASUREMENTS,
    RUNTIME_ROW,
    build_profile,
    host_key,
    host_limits,
    kernel_flops,
)
from tuner.timing.profile_match import KilnCall, OrtNode, kernel_kind, match_nodes
from tuner.timing.profile_runs import node_flops, onnxruntime_profile_summary, tvm_kernel_calls

LIMITS = MachineLimits(
    peak_gflops=200.0,
    peak_gflops_one_thread=100.0,
    bandwidth_gbs=40.0,
    threads=2,
    vector_lanes=16,
    how="t",
    version=LIMITS_VERSION,
)


def _node_event(name: str, op: str, ts: int, dur: int, **args: object) -> dict:
    return {
        "cat": "Node",
        "name": f"{name}_kernel_time",
        "ts": ts,
        "dur": dur,
        "args": {"op_name": op, **args},
    }


def _run_event(ts: int, dur: int) -> dict:
    return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}


def test_onnxruntime_events_give_each_node_its_median_over_the_kept_runs() -> None:
    conv_shapes = {
        "input_type_shape": [{"float": [1, 3, 8, 8]}, {"float": [16, 3, 3, 3]}],
        "output_type_shape": [{"float": [1, 16, 8, 8]}],
    }
    events = []
    for run, (conv_us, relu_us) in enumerate([(500, 90), (10, 2), (12, 4), (11, 3)]):
        start = 1000 * run
        events.append(_run_event(start, 100))
        events.append(_node_event("conv", "Conv", start + 1, conv_us, **conv_shapes))
        events.append({"cat": "Node", "name": "conv_fence_before", "ts": start + 2, "dur": 1})
        events.append(_node_event("relu", "Relu", start + 50, relu_us))
    events.append(_node_event("outside", "Relu", 99_999, 7))  # in no run: session set-up
    summary = onnxruntime_profile_summary(events, skip_runs=1)
    assert summary["runs"] == 3 and summary["run_us"] == 100
    assert [n["name"] for n in summary["nodes"]] == ["conv", "relu"]
    conv, relu = summary["nodes"]
    assert conv["us"] == 11 and relu["us"] == 3  # the first run (warm-up) left out
    assert conv["op"] == "Conv" and conv["flops"] == 2 * 16 * 8 * 8 * 3 * 3 * 3
    assert relu["flops"] is None


def test_node_flops_of_products_and_convolutions() -> None:
    matmul = {
        "input_type_shape": [{"float": [4, 256]}, {"float": [256, 512]}],
        "output_type_shape": [{"float": [4, 512]}],
    }
    assert node_flops("MatMul", matmul) == 2 * 4 * 512 * 256
    assert node_flops("Gemm", matmul) == 2 * 4 * 512 * 256
    depthwise = {
        "input_type_shape": [{"float": [1, 32, 16, 16]}, {"float": [32, 1, 3, 3]}],
        "output_type_shape": [{"float": [1, 32, 16, 16]}],
    }
    assert node_flops("FusedConv", depthwise) == 2 * 32 * 16 * 16 * 9
    assert node_flops("Relu", depthwise) is None
    assert node_flops("Conv", {}) is None


def test_kernel_kinds_come_from_their_names() -> None:
    assert kernel_kind("fused_conv2d1_add1_relu_prepacked") == "conv"
    assert kernel_kind("fused_matmul_add21") == "matmul"
    assert kernel_kind("max_pool2d") == "max_pool"
    assert kernel_kind("mean1") == "avg_pool"
    assert kernel_kind("fused_add_relu") is None


def test_nodes_match_kernels_in_order_by_kind_and_flops() -> None:
    calls = [
        KilnCall("fused_conv2d_add_relu", 1000.0),
        KilnCall("fused_conv2d1_add1", 4000.0),
        KilnCall("fused_add2_relu1", None),
        KilnCall("mean", 10.0),
        KilnCall("fused_matmul_add", 500.0),
    ]
    nodes = [
        OrtNode("c1", "Conv", 5.0, 990.0),
        OrtNode("r1", "Relu", 1.0),  # fused into the first kernel by Kiln
        OrtNode("c2", "Conv", 9.0, 3800.0),
        OrtNode("a2", "Add", 1.0),  # Kiln fused it into the second convolution
        OrtNode("r2", "Relu", 1.0),  # Kiln's separate add + relu kernel
        OrtNode("pool", "GlobalAveragePool", 1.0),
        OrtNode("flat", "Reshape", 0.5),  # Kiln has no kernel for it
        OrtNode("fc", "Gemm", 2.0, 512.0),
    ]
    assert match_nodes(calls, nodes) == [0, 0, 1, 1, 2, 3, None, 4]


def test_a_product_of_other_flops_is_never_matched_to_a_kernel() -> None:
    calls = [KilnCall("fused_matmul", 100.0), KilnCall("fused_matmul1", 10_000.0)]
    # The first product is a different layer from Kiln's first: it matches the second, and the second
    # node then finds nothing after it.
    nodes = [OrtNode("big", "MatMul", 1.0, 10_100.0), OrtNode("small", "MatMul", 1.0, 100.0)]
    assert match_nodes(calls, nodes) == [1, None]


def _kiln_calls() -> dict:
    return {
        "runs": 10,
        "run_us": 120.0,
        "calls": [
            {"name": "vm.builtin.alloc_tensor", "bytes": 0, "us": None},
            {"name": "fused_conv2d_add_relu", "bytes": 4000, "us": 60.0},
            {"name": "vm.builtin.reshape", "bytes": 0, "us": None},
            {"name": "fused_conv2d_add_relu", "bytes": 4000, "us": 40.0},
            {"name": "fused_matmul_add_prepacked", "bytes": 1000, "us": 8.5},
        ],
    }


def test_a_profile_has_one_row_per_kernel_and_one_for_the_runtime() -> None:
    flops = {"fused_conv2d_add_relu": 2e6, "fused_matmul_add": 1e5}
    onnxruntime = {
        "runs": 10,
        "run_us": 150.0,
        "nodes": [
            {"name": "c1", "op": "FusedConv", "us": 70.0, "flops": 2e6},
            {"name": "c2", "op": "FusedConv", "us": 50.0, "flops": 2e6},
            {"name": "flatten", "op": "Flatten", "us": 3.0, "flops": None},
            {"name": "fc", "op": "Gemm", "us": 6.0, "flops": 1e5},
        ],
    }
    profile = build_profile(_kiln_calls(), flops, onnxruntime=onnxruntime, latency_ms=0.11, limits=LIMITS)
    assert [k.name for k in profile.kernels] == [
        "fused_conv2d_add_relu",
        RUNTIME_ROW,
        "fused_matmul_add_prepacked",
    ]
    conv, runtime, fc = profile.kernels
    # The VM's own work: the run (120 µs) less the kernels (108.5 µs).
    assert profile.total_us == pytest.approx(120.0) and profile.run_us == 120.0
    assert runtime.total_us == pytest.approx(11.5) and profile.kernels_us == pytest.approx(108.5)
    assert sum(k.share for k in profile.kernels) == pytest.approx(1.0)
    assert conv.calls == 2 and conv.total_us == 100.0 and conv.bytes == 4000
    assert conv.gflops == pytest.approx(2 * 2e6 / 100e-6 / 1e9)
    assert conv.intensity == pytest.approx(500.0) and conv.bound(LIMITS) == "compute"
    assert conv.onnxruntime_us == 120.0 and conv.compared and conv.onnxruntime_nodes == ("c1", "c2")
    assert fc.flops == 1e5  # its planned name's, before prepacking renamed it
    assert fc.intensity == pytest.approx(100.0) and fc.bound(LIMITS) == "compute"
    assert fc.attainable_gflops(LIMITS) == 200.0
    assert runtime.kind == "runtime" and runtime.calls == 2 and runtime.flops is None
    assert profile.onnxruntime_unmatched_us == 3.0 and profile.onnxruntime_total_us == 150.0

    again = ModelProfile.from_dict(profile.as_dict())
    assert again == profile


def test_kernels_slower_in_place_than_the_run_leave_the_runtime_nothing() -> None:
    profile = build_profile({**_kiln_calls(), "run_us": 100.0}, {})
    runtime = next(k for k in profile.kernels if k.kind == "runtime")
    assert runtime.total_us == 0.0 and profile.total_us == pytest.approx(108.5)


def test_memory_bound_kernels_lie_left_of_the_ridge() -> None:
    copy = KernelProfile("transpose", "kernel", 1, 10.0, 1.0, flops=1000.0, bytes=8000)
    assert copy.intensity == 0.125 and copy.bound(LIMITS) == "memory"
    assert copy.attainable_gflops(LIMITS) == pytest.approx(40.0 * 0.125)
    assert copy.bound(None) is None and KernelProfile("x", "kernel", 1, 1.0, 1.0).intensity is None
    assert LIMITS.ridge_intensity == 5.0


def test_profiles_and_machine_limits_are_kept(store: Store) -> None:
    job_id = add_job(store)
    with pytest.raises(NotFound, match="no profile"):
        store.get_job_profile(job_id)
    profile = build_profile(_kiln_calls(), {"fused_conv2d_add_relu": 2e6}, limits=LIMITS)
    store.set_job_profile(job_id, profile)
    store.set_job_profile(job_id, profile)  # a rerun replaces it
    assert store.get_job_profile(job_id) == profile

    assert store.get_machine_limits("host-a llvm") is None
    saved = store.save_machine_limits("host-a llvm", LIMITS)
    assert saved.host == "host-a llvm" and saved.measured_at is not None
    assert store.get_machine_limits("host-a llvm") == saved
    faster = store.save_machine_limits("host-a llvm", dataclasses.replace(LIMITS, peak_gflops=300.0))
    assert store.get_machine_limits("host-a llvm") == faster and faster.peak_gflops == 300.0
    assert store.get_machine_limits("host-b llvm") is None


def test_limits_measured_on_a_busy_machine_are_measured_again_and_kept_at_their_best(store: Store) -> None:
    """A figure measured while another process kept a core busy is low, and the limits are kept per host: the
    next jobs measure them again (a few times at most), keeping each figure at its best."""
    target = host_target()
    busy = dataclasses.replace(LIMITS, peak_gflops=110.0, other_cpu_share=0.5, disturbed=True)
    measurements = iter([busy, busy, dataclasses.replace(LIMITS, bandwidth_gbs=35.0), LIMITS])
    measured: list[MachineLimits] = []

    def measure(t: dict[str, Any]) -> MachineLimits:
        assert t == target
        measured.append(next(measurements))
        return measured[-1]

    first = host_limits(store, target, measure)
    assert first.disturbed and first.peak_gflops == 110.0 and first.measurements == 1
    # Busy again: still disturbed, the best of two.
    second = host_limits(store, target, measure)
    assert second.disturbed and second.measurements == 2 and len(measured) == 2
    # Quiet at last: each figure the higher of the kept and the new, no longer disturbed.
    third = host_limits(store, target, measure)
    assert not third.disturbed and third.measurements == 3
    assert third.peak_gflops == 200.0 and third.bandwidth_gbs == 40.0  # 35 GB/s quiet, 40 kept before
    assert store.get_machine_limits(host_key(target)) == third
    # Quiet limits are kept as they are.
    assert host_limits(store, target, measure) == third and len(measured) == 3


def test_limits_disturbed_every_time_stop_being_measured_again(store: Store) -> None:
    target = host_target()
    busy = dataclasses.replace(LIMITS, other_cpu_share=0.6, disturbed=True)
    calls: list[int] = []

    def measure(t: dict[str, Any]) -> MachineLimits:
        calls.append(1)
        return busy

    for _ in range(LIMIT_MEASUREMENTS + 2):
        kept = host_limits(store, target, measure)
    assert len(calls) == LIMIT_MEASUREMENTS
    assert kept.disturbed and kept.measurements == LIMIT_MEASUREMENTS


def test_a_compiled_model_is_profiled_call_by_call(tmp_path: Path) -> None:
    from kiln_tvm import relax

    model_path = tmp_path / "cnn.onnx"
    onnx.save(build_small_cnn(image_size=16), str(model_path))
    imported = load_model(model_path, {})
    lib = export_library(build_untuned(imported.mod, to_tvm_target(host_target())), tmp_path / "m.so")
    calls = tvm_kernel_calls(str(lib), random_inputs(imported.signature), budget_s=0.2)
    assert calls["run_us"] > 0 and calls["runs"] >= 5

    # Every kernel called is a TIR function of the lowered model, and its FLOPs are known from its TIR.
    flops = kernel_flops(relax.transform.LegalizeOps()(imported.mod))  # what plain compilation calls
    names = [c["name"] for c in calls["calls"]]
    kernels = {n for n in names if not n.startswith("vm.")}
    assert kernels and kernels <= set(flops) | {"reshape", "transpose"}, kernels - set(flops)
    assert any(n.startswith("vm.builtin.") for n in names)
    assert all(c["us"] is None for c in calls["calls"] if c["name"].startswith("vm."))
    assert all(c["us"] >= 0 for c in calls["calls"] if not c["name"].startswith("vm."))
    convs = [c for c in calls["calls"] if c["name"].startswith("conv2d")]
    assert len(convs) == 3 and all(c["bytes"] > 0 and c["us"] > 0 for c in convs)
    assert flops["conv2d"] > 0 and np.isfinite(sum(c["us"] for c in convs))


def _child_result(kernels_us: float, run_us: float) -> dict[str, Any]:
    return {
        "runs": 5,
        "run_us": run_us,
        "calls": [
            {"name": "conv", "bytes": 1, "us": kernels_us},
            {"name": "vm.builtin.x", "bytes": 0, "us": None},
        ],
    }


@pytest.mark.parametrize(
    ("attempts", "kept", "taken"),
    [
        ([(700.0, 1000.0), (950.0, 1000.0), (500.0, 1000.0)], 1, 2),  # the second agrees: no third
        ([(700.0, 1000.0), (1300.0, 1000.0), (820.0, 1000.0)], 2, 3),  # none agrees: the nearest
        ([(990.0, 1000.0)], 0, 1),
    ],
)
def test_a_profile_whose_kernels_and_run_disagree_is_taken_again_and_the_nearest_kept(
    monkeypatch: pytest.MonkeyPatch, attempts: list[tuple[float, float]], kept: int, taken: int
) -> None:
    import tuner.timing.profile as profile

    results = [_child_result(k, r) for k, r in attempts]
    requests: list[list[str]] = []

    def child(request: list[str], timeout_s: float = 600) -> dict[str, Any]:
        requests.append(request)
        return results[len(requests) - 1]

    monkeypatch.setattr(profile, "run_child", child)
    assert profile._consistent_profile(["tvm-profile", "m.so", "in.npz", "2.0"]) is results[kept]
    assert len(requests) == taken and profile.PROFILE_TRIES == 3
