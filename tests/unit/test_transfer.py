"""Schedules transferred between similar workloads: the family and anchor keys, the adapted tile factors, a
matmul's trace replayed on another shape, and its decisions replayed under another fused epilogue, each
computing the right result."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from kiln_tvm import ms, s_tir, tvm
from schedules.spaces import space_for
from schedules.transfer import (
    adapted_tiles,
    anchor_family,
    decisions_transferred,
    iteration_extents,
    sampled_decisions,
    shape_distance,
    transferred_schedule,
    within_reach,
    workload_family,
)
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())
te = tvm.te


def matmul(m: int, n: int, k: int, relu: bool = True, dtype: str = "float32") -> Any:
    """``max(A @ B, 0)`` (or ``A @ B``) as one task's module."""
    a = te.placeholder((m, k), name="A", dtype=dtype)
    b = te.placeholder((k, n), name="B", dtype=dtype)
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    if not relu:
        return tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    d = te.compute((m, n), lambda i, j: te.max(c[i, j], tvm.tirx.const(0, dtype)), name="D")
    return tvm.IRModule({"main": te.create_prim_func([a, b, d])})


def matmul_bias_tanh(m: int, n: int, k: int) -> Any:
    """``tanh(A @ B + bias)``: the matmul anchor under another epilogue, of two blocks."""
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    bias = te.placeholder((n,), name="bias")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    e = te.compute((m, n), lambda i, j: c[i, j] + bias[j], name="E")
    f = te.compute((m, n), lambda i, j: te.tanh(e[i, j]), name="F")
    return tvm.IRModule({"main": te.create_prim_func([a, b, bias, f])})


def batch_matmul(m: int) -> Any:
    """A batched matmul: another anchor, four loops to tile."""
    a = te.placeholder((4, m, m), name="A")
    b = te.placeholder((4, m, m), name="B")
    r = te.reduce_axis((0, m), name="k")
    c = te.compute((4, m, m), lambda x, i, j: te.sum(a[x, i, r] * b[x, r, j], axis=r), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def _context(mod: Any) -> Any:
    return ms.TuneContext(
        mod=mod, target=TARGET, space_generator=space_for(TARGET, "cpu"), task_name="t", num_threads=2
    ).clone()


def _postprocs(mod: Any) -> list[Any]:
    return list(_context(mod).space_generator.postprocs)


def _spaces(mod: Any) -> list[Any]:
    return list(_context(mod).space_generator.generate_design_space(mod))


def _sampled_trace(mod: Any, seed: int) -> Any:
    """A design-space sample of ``mod`` (its random tile decisions), as a measured record's trace is."""
    context = ms.TuneContext(
        mod=mod, target=TARGET, space_generator=space_for(TARGET, "cpu"), task_name="t", rand_state=seed
    ).clone()
    space = context.space_generator.generate_design_space(mod)[0]
    sch = s_tir.Schedule(mod, seed=seed)
    space.trace.apply_to_schedule(sch, remove_postproc=True)
    return sch.trace


def _tile_decisions(trace: Any) -> list[list[int]]:
    """The trace's tile factors, in the order of its instructions."""
    return [
        [int(f) for f in trace.get_decision(inst)]
        for inst in trace.insts
        if inst.kind.name == "SamplePerfectTile"
    ]


def test_one_operator_at_other_shapes_is_one_family_and_another_operator_is_not() -> None:
    family = workload_family(matmul(64, 128, 256))
    assert family is not None and len(family) == 16
    assert workload_family(matmul(96, 48, 512)) == family
    assert workload_family(matmul(64, 128, 256, relu=False)) != family  # another epilogue
    assert workload_family(matmul(64, 128, 256, dtype="float16")) != family  # another dtype
    assert iteration_extents(matmul(64, 128, 256)) == [64, 128, 256, 64, 128]


def test_a_shape_is_within_reach_when_every_extent_is() -> None:
    assert within_reach([128, 768, 3072], [197, 384, 1536], 1.0)  # each within 2x
    assert not within_reach([128, 768, 3072], [1, 2, 1280], 1.0)  # a GEMV is no tiling for a GEMM
    # A 3x3 convolution and a 1x1 one: close on the mean of the iterators, but not on the window's.
    assert not within_reach([1, 28, 28, 128, 3, 3, 128], [1, 28, 28, 144, 1, 1, 96], 1.0)
    assert not within_reach([64], [64, 1], 1.0) and not within_reach([0, 8], [4, 8], 1.0)


def test_shape_distance_is_the_sum_of_log_ratios() -> None:
    assert shape_distance([64, 128], [64, 128]) == 0
    assert shape_distance([64, 128], [32, 512]) == pytest.approx(3.0)
    assert shape_distance([64], [64, 1]) == math.inf  # another number of iterators
    assert shape_distance([0, 8], [4, 8]) == math.inf  # a symbolic extent


@pytest.mark.parametrize(
    ("factors", "extent", "cap", "expected"),
    [
        ([1, 4, 8, 2], 64, 64, [1, 4, 8, 2]),  # the same extent: unchanged
        ([1, 4, 8, 2], 96, 64, [2, 3, 8, 2]),  # 96 = 2 x 48: 2, 8 kept, 3 nearest 4 that divides 6
        ([1, 2, 8, 8], 48, 64, [1, 1, 6, 8]),
        ([4, 16], 7, 64, [1, 7]),  # a prime extent: its one divisor nearest 16
        ([2, 64], 256, 16, [16, 16]),  # the innermost held to its cap
        ([32, 1, 1], 1, 64, [1, 1, 1]),
    ],
)
def test_tiles_are_adapted_to_the_new_extent(
    factors: list[int], extent: int, cap: int, expected: list[int]
) -> None:
    adapted = adapted_tiles(factors, extent, cap)
    assert adapted == expected
    assert math.prod(adapted) == extent


def test_a_trace_replays_on_another_shape_with_its_tiles_adapted_and_computes_the_product() -> None:
    source = matmul(64, 128, 256)
    trace = _sampled_trace(source, seed=5)
    new = matmul(96, 48, 512)
    sch = transferred_schedule(trace, new, _postprocs(new))
    assert sch is not None
    # Every tile decision now multiplies out to the new loop it splits: i 96, j 48, k 512.
    assert sorted(math.prod(d) for d in _tile_decisions(sch.trace)) == [48, 96, 512]
    assert sorted(math.prod(d) for d in _tile_decisions(trace)) == [64, 128, 256]

    lib = tvm.compile(sch.mod, target=TARGET)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 512)).astype(np.float32)
    w = rng.standard_normal((512, 48)).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros((96, 48), np.float32))
    lib(tvm.runtime.tensor(x), tvm.runtime.tensor(w), out)
    np.testing.assert_allclose(out.numpy(), np.maximum(x @ w, 0), rtol=1e-4, atol=1e-3)


def test_a_trace_of_another_family_does_not_replay() -> None:
    trace = _sampled_trace(matmul(64, 128, 256), seed=5)
    other = matmul(64, 128, 256, relu=False)  # no block D for the trace to find
    assert transferred_schedule(trace, other, _postprocs(other)) is None


def _fixed_split_trace(n: int) -> Any:
    """A rule-like schedule of ``matmul_relu(n)``: its rows split by a fixed 16, the inner part reduced
    into partials (rfactor) and vectorised."""
    sch = s_tir.Schedule(matmul(n, 64, n))
    _, _, k = sch.get_loops(sch.get_sblock("C"))
    _, inner = sch.split(k, factors=[None, 16])
    sch.rfactor(inner, factor_axis=0)
    return sch.trace


@pytest.mark.parametrize(("n", "fits"), [(96, True), (100, False)])
def test_a_fixed_split_transfers_only_where_it_divides_the_new_extent(n: int, fits: bool) -> None:
    trace = _fixed_split_trace(64)
    new = matmul(n, 64, n)
    sch = transferred_schedule(trace, new, _postprocs(new))
    assert (sch is not None) == fits
    if sch is None:
        return
    lib = tvm.compile(sch.mod, target=TARGET)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, n)).astype(np.float32)
    w = rng.standard_normal((n, 64)).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros((n, 64), np.float32))
    lib(tvm.runtime.tensor(x), tvm.runtime.tensor(w), out)
    np.testing.assert_allclose(out.numpy(), np.maximum(x @ w, 0), rtol=1e-4, atol=1e-3)


def test_one_operator_under_other_epilogues_shares_its_anchor() -> None:
    anchor = anchor_family(matmul(64, 128, 256))
    assert anchor is not None and len(anchor) == 16
    assert anchor_family(matmul(96, 48, 512, relu=False)) == anchor  # no epilogue, other shapes
    assert anchor_family(matmul_bias_tanh(64, 128, 256)) == anchor  # a two-block epilogue
    assert anchor_family(matmul(64, 128, 256, dtype="float16")) != anchor
    assert anchor_family(batch_matmul(64)) != anchor
    a = te.placeholder((64,), name="A")
    elementwise = tvm.IRModule({"main": te.create_prim_func([a, te.compute((64,), lambda i: a[i] * 2)])})
    assert anchor_family(elementwise) is None  # no reduction: nothing to anchor on
    assert iteration_extents(matmul_bias_tanh(64, 128, 256), anchor_only=True) == [64, 128, 256]


def test_decisions_replay_under_another_epilogue_with_tiles_adapted_and_compute_the_result() -> None:
    trace = _sampled_trace(matmul(64, 128, 256), seed=5)
    new = matmul_bias_tanh(96, 48, 512)
    sch = decisions_transferred(trace, new, _spaces(new), _postprocs(new))
    assert sch is not None
    # The i, j and k tiles of the new schedule are the old ones, in order, adapted to 96, 48 and 512.
    old_tiles = _tile_decisions(trace)
    caps = [int(inst.attrs[1]) for inst in sch.trace.insts if inst.kind.name == "SamplePerfectTile"]
    new_tiles = _tile_decisions(sch.trace)
    assert [math.prod(t) for t in new_tiles] == [96, 48, 512]
    assert new_tiles == [
        adapted_tiles(o, math.prod(t), c) for o, t, c in zip(old_tiles, new_tiles, caps, strict=True)
    ]
    # The unroll choice (the root's categorical sample) is the old one.
    assert sampled_decisions(sch.trace)["SampleCategorical"] == sampled_decisions(trace)["SampleCategorical"]

    lib = tvm.compile(sch.mod, target=TARGET)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((96, 512)).astype(np.float32) / 8
    w = rng.standard_normal((512, 48)).astype(np.float32) / 8
    bias = rng.standard_normal(48).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros((96, 48), np.float32))
    lib(tvm.runtime.tensor(x), tvm.runtime.tensor(w), tvm.runtime.tensor(bias), out)
    np.testing.assert_allclose(out.numpy(), np.tanh(x @ w + bias), rtol=1e-4, atol=1e-4)


def test_decisions_do_not_replay_on_a_space_that_tiles_other_loops() -> None:
    trace = _sampled_trace(matmul(64, 64, 64), seed=5)
    other = batch_matmul(64)
    assert decisions_transferred(trace, other, _spaces(other), _postprocs(other)) is None
