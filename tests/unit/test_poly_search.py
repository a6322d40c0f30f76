"""The cpu-poly hooks: tilings read off a trace, their cut footprints against the caches, the pruner's soft
rejection, and the ranked seeds, on a matmul's real design space."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kiln_tvm import ms, tvm
from schedules.poly.caches import CacheHierarchy, CacheLevel
from schedules.poly.extract import extract_program
from schedules.poly.search import (
    FootprintPruner,
    PruningStats,
    _reduces_over_one_axis,
    seed_schedules,
    traced_tilings,
)
from schedules.poly.tiling import (
    MachineModel,
    Tiling,
    cut_footprints,
    cut_names,
    inner_shape,
    modelled_cycles,
    overflows,
    rank_tilings,
    tile_below,
)
from schedules.spaces import SpaceOptions, space_for
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())
CACHES = CacheHierarchy(
    (CacheLevel("L1d", 1, 32 << 10), CacheLevel("L2", 2, 1 << 20), CacheLevel("L3", 3, 32 << 20)), "settings"
)
te = tvm.te


def _matmul(n: int = 256) -> tvm.IRModule:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def _context(mod: tvm.IRModule, space: str = "cpu-poly", stats: PruningStats | None = None):
    return ms.TuneContext(
        mod=mod,
        target=TARGET,
        space_generator=space_for(TARGET, space, SpaceOptions(caches=CACHES), stats),
        task_name="matmul",
        num_threads=2,
    ).clone()


def test_cuts_and_tiles_follow_the_structure() -> None:
    (statement,) = extract_program(_matmul()["main"]).statements
    tiling = Tiling("SSRSRS", ((2, 4, 2, 16), (4, 2, 2, 16), (16, 16)))
    assert cut_names("SSRSRS") == ["S0", "S1", "R0", "S2", "R1", "S3"]
    assert tile_below(statement, tiling, 0) == (128, 64, 256)  # one S0 iteration: all reductions
    assert tile_below(statement, tiling, 2) == (32, 32, 16)  # below R0: S2*S3 by R1
    assert tile_below(statement, tiling, 5) == (1, 1, 1)
    cuts = cut_footprints(statement, tiling)
    assert cuts["R0"] == 4 * (32 * 16 + 16 * 32 + 32 * 32)
    assert list(cuts.values()) == sorted(cuts.values(), reverse=True)
    assert overflows(statement, tiling, CACHES, 0.5) == []
    # One 256 x 256 x 256 block: 768 KiB below S2, far over L1d's 48 KiB with the margin; it fits L2.
    whole = Tiling("SSRSRS", ((1, 1, 1, 256), (1, 1, 1, 256), (1, 256)))
    assert [p.split(":")[0] for p in overflows(statement, whole, CACHES, 0.5)] == ["S2"]
    assert overflows(statement, whole, CacheHierarchy((), "unknown"), 0.5) == []


def test_tilings_are_read_off_a_design_spaces_trace() -> None:
    mod = _matmul()
    spaces = _context(mod).space_generator.generate_design_space(mod)
    tilings = [t for space in spaces for t in traced_tilings(space.trace)]
    assert tilings and all(t.block == "C" and t.structure == "SSRSRS" for t in tilings)
    for t in tilings:
        assert [len(f) for f in t.factors] == [4, 4, 2]
        assert [math.prod(f) for f in t.factors] == [256, 256, 256]


def test_ranked_tilings_fill_vectors_and_feed_every_thread() -> None:
    (statement,) = extract_program(_matmul()["main"]).statements
    machine = MachineModel(lanes=16, threads=2, caches=CACHES)
    ranked = rank_tilings(statement, "SSRSRS", machine, 4, seed=1)
    assert len(ranked) == 4 and ranked == rank_tilings(statement, "SSRSRS", machine, 4, seed=1)
    for tiling in ranked:
        assert [math.prod(f) for f in tiling.factors] == [256, 256, 256]
        assert tiling.factors[1][-1] % 16 == 0  # the vector loop j uses whole vectors
        assert tiling.factors[0][0] * tiling.factors[1][0] >= 2  # both threads have work
        assert overflows(statement, tiling, CACHES, 0.0) == []


def test_the_model_charges_short_reduction_chunks_and_broadcast_heavy_register_tiles() -> None:
    (statement,) = extract_program(_matmul()["main"]).statements
    machine = MachineModel(lanes=16, threads=2, caches=CACHES)
    # The same 8 x 32 register tile (16 accumulators): 64 reduction steps per chunk hide the
    # accumulators' store and reload; 2 steps do not.
    long_chunk = Tiling("SSRSRS", ((2, 8, 2, 8), (2, 4, 1, 32), (4, 64)))
    short_chunk = Tiling("SSRSRS", ((2, 8, 2, 8), (2, 4, 1, 32), (128, 2)))
    assert modelled_cycles(statement, short_chunk, machine) > 1.5 * modelled_cycles(
        statement, long_chunk, machine
    )
    # 16 x 16: 16 broadcasts of A and one vector of B per 16 FMAs; 8 x 32 loads 10.
    square = Tiling("SSRSRS", ((2, 8, 1, 16), (2, 8, 1, 16), (4, 64)))
    assert modelled_cycles(statement, square, machine) > modelled_cycles(statement, long_chunk, machine)


def test_ranked_tilings_differ_in_their_register_tiles() -> None:
    (statement,) = extract_program(_matmul()["main"]).statements
    machine = MachineModel(lanes=16, threads=2, caches=CACHES)
    diverse = rank_tilings(statement, "SSRSRS", machine, 4)
    assert len({inner_shape(t) for t in diverse}) == 4
    best = rank_tilings(statement, "SSRSRS", machine, 1, diverse=False)
    assert diverse[0] == best[0]


def test_seeds_carry_the_ranked_tilings_and_build() -> None:
    mod = _matmul()
    context = _context(mod)
    seeds = seed_schedules(context, MachineModel(16, 2, CACHES), 3)
    assert len(seeds) == 3
    (statement,) = extract_program(mod["main"]).statements
    best = rank_tilings(statement, "SSRSRS", MachineModel(16, 2, CACHES), 3)
    assert {traced_tilings(s.trace)[0].factors for s in seeds} == {t.factors for t in best}
    tvm.compile(seeds[0].mod, target=TARGET)  # postprocessed: it builds


def _classifier() -> tvm.IRModule:
    """A classifier's last layer: a 512 x 1000 matmul and its bias add (the epilogue)."""
    a = te.placeholder((1, 512), name="a")
    w = te.placeholder((512, 1000), name="w")
    b = te.placeholder((1000,), name="b")
    k = te.reduce_axis((0, 512), name="k")
    mm = te.compute((1, 1000), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="matmul")
    out = te.compute((1, 1000), lambda i, j: mm[i, j] + b[j], name="T_add")
    return tvm.IRModule(
        {"main": te.create_prim_func([a, w, b, out]).with_attr("layout_free_buffers", [1, 2])}
    )


def _assert_computes_the_classifier(sch: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(shape).astype(np.float32) for shape in ((1, 512), (512, 1000), (1000,))]
    result = tvm.runtime.tensor(np.zeros((1, 1000), np.float32))
    tvm.compile(sch.mod, target=TARGET)(*(tvm.runtime.tensor(x) for x in args), result)
    np.testing.assert_allclose(result.numpy(), args[0] @ args[1] + args[2], rtol=1e-4, atol=1e-4)


def test_seeds_of_a_classifier_with_a_predicated_bias_add_build_and_compute_it() -> None:
    # 1000 classes: the bias add's vector blocks are predicated, which the schedule's debug verification
    # took for an error (it failed the whole job of every ResNet under cpu-poly).
    seeds = seed_schedules(_context(_classifier()), MachineModel(16, 2, CACHES), 3)
    assert seeds
    for sch in seeds:
        _assert_computes_the_classifier(sch, 0)


def test_an_unmeasured_seed_accumulates_per_tile_fully_unrolled_and_computes_the_model() -> None:
    # The classifier's matmul has an epilogue: a space that fuses it at a tile loop exists and comes first.
    context = _context(_classifier())
    spaces = [s.trace for s in context.space_generator.generate_design_space(context.mod)]
    assert not any(i.kind.name in ("CacheWrite", "ReverseComputeAt") for i in spaces[0].insts)  # the default

    (sch,) = seed_schedules(context, MachineModel(16, 2, CACHES), 1, unmeasured=True)

    kinds = [inst.kind.name for inst in sch.trace.insts]
    assert "ReverseComputeAt" in kinds or "CacheWrite" in kinds
    unroll = [
        inst
        for inst in sch.trace.insts
        if inst.kind.name == "SampleCategorical" and inst in sch.trace.decisions
    ]
    assert unroll
    for inst in unroll:
        candidates = [int(c) for c in inst.attrs[0]]
        assert int(sch.trace.decisions[inst]) == candidates.index(max(candidates))
    _assert_computes_the_classifier(sch, 1)


def test_only_a_reduction_over_one_axis_counts_as_matmul_like_for_unmeasured_seeds() -> None:
    # A 3x3 convolution keeps its spaces' order and samples unmeasured (measured over ResNet-18, per-tile
    # accumulation and full unrolling slowed it down); a matmul and a pointwise convolution do not.
    def conv(window: int) -> tvm.IRModule:
        x = te.placeholder((1, 10, 10, 16), name="x")
        w = te.placeholder((window, window, 16, 32), name="w")
        ry, rx = te.reduce_axis((0, window), "ry"), te.reduce_axis((0, window), "rx")
        rc = te.reduce_axis((0, 16), "rc")
        out = te.compute(
            (1, 11 - window, 11 - window, 32),
            lambda n, h, v, f: te.sum(x[n, h + ry, v + rx, rc] * w[ry, rx, rc, f], axis=[ry, rx, rc]),
            name="conv",
        )
        return tvm.IRModule({"main": te.create_prim_func([x, w, out]).with_attr("layout_free_buffers", [1])})

    def one_axis(mod: tvm.IRModule) -> bool:
        context = _context(mod)
        (space, *_) = context.space_generator.generate_design_space(context.mod)
        return _reduces_over_one_axis([(traced, []) for traced in traced_tilings(space.trace)])

    assert not one_axis(conv(3))
    assert one_axis(conv(1))
    assert one_axis(_matmul())


def test_the_pruner_rejects_overflowing_tiles_softly_and_counts() -> None:
    mod = _matmul()
    stats = PruningStats()
    context = _context(mod, stats=stats)
    space = context.space_generator.generate_design_space(mod)[0]
    traced = traced_tilings(space.trace)[0]
    whole = [(1, 1, 1, 256), (1, 1, 1, 256), (1, 256)]
    trace = space.trace
    for inst, factors in zip(traced.instructions, whole, strict=True):
        trace = trace.with_decision(inst, list(factors), True)
    sch = tvm.s_tir.Schedule(mod)
    trace.apply_to_schedule(sch, remove_postproc=True)
    strict = FootprintPruner(CACHES, margin=0.5, pass_through=0.0, stats=stats)
    strict._initialize_with_tune_context(context)
    assert strict.apply(sch) is False
    lenient = FootprintPruner(CACHES, margin=0.5, pass_through=1.0, stats=stats)
    lenient._initialize_with_tune_context(context)
    assert lenient.apply(sch) is True
    assert (stats.examined, stats.rejected, stats.passed_through) == (2, 1, 1)
