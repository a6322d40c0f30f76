"""The polyhedral layer on TIR written here: extraction of domains and accesses, dependences and the
legality they give, fusion depths, inexact accesses, and the footprint model against isl's exact count."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln_tvm import tir_script as T
from kiln_tvm import tvm
from schedules.poly.analysis import analyse_prim_func
from schedules.poly.caches import UNKNOWN, CacheHierarchy, CacheLevel, parse_cache_spec, read_sysfs_caches
from schedules.poly.extract import extract_program
from schedules.poly.footprint import exact_tile_footprint, reuse_directions, tile_footprint
from schedules.poly.isl_model import IslProgram
from schedules.poly.program import LoopKind

te, topi = tvm.te, tvm.topi
CACHES = CacheHierarchy((CacheLevel("L1d", 1, 32 << 10), CacheLevel("L2", 2, 1 << 20)), "settings")


def _matmul(m: int = 64, n: int = 48, k: int = 32) -> tvm.tirx.PrimFunc:
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


@T.prim_func(s_tir=True)
def _skewed_stencil(A: T.Buffer((16, 16), "float32")) -> None:
    # A[i + 1, j] depends on A[i, j + 1], written one row earlier and one column later: distance (1, -1).
    for i, j in T.grid(15, 15):
        with T.sblock("S"):
            vi, vj = T.axis.remap("SS", [i, j])
            A[vi + 1, vj] = A[vi, vj + 1] + T.float32(1.0)


@T.prim_func(s_tir=True)
def _unpack(A: T.Buffer((16, 4), "float32"), B: T.Buffer((64,), "float32")) -> None:
    for i in range(64):
        with T.sblock("unpack"):
            vi = T.axis.remap("S", [i])
            B[vi] = A[vi // 4, vi % 4]


def test_matmul_domain_and_accesses_are_read_off_the_tir() -> None:
    program = extract_program(_matmul())
    (statement,) = program.statements
    assert [(loop.name, loop.extent, loop.kind) for loop in statement.loops] == [
        ("i", 64, LoopKind.SPATIAL),
        ("j", 48, LoopKind.SPATIAL),
        ("k", 32, LoopKind.REDUCTION),
    ]
    a = next(x for x in statement.reads() if x.tensor.name == "A")
    assert [index.coefficients for index in a.indices] == [(1, 0, 0), (0, 0, 1)]
    # The update reads its accumulator, although block.reads leaves it out.
    assert any(x.tensor.name == "C" for x in statement.reads())
    ip = IslProgram(program)
    assert str(ip.statements[0].domain) == "{ S0[i, j, k] : 0 <= i <= 63 and 0 <= j <= 47 and 0 <= k <= 31 }"
    assert "A[o0 = i, o1 = k]" in str(ip.statements[0].access(a))


def test_matmul_only_k_carries_a_dependence_and_i_j_are_parallel_and_permutable() -> None:
    analysis = analyse_prim_func(_matmul(), CACHES)
    own = [d for d in analysis.dependences if d.source == d.sink == "C"]
    assert {d.kind.value for d in own} == {"RAW", "WAR", "WAW"}
    for dependence in own:
        assert dependence.carried_by == ("k",)
        assert dependence.distance_text == "(0, 0, 1..31)"
    loops = {loop.loop: loop for loop in analysis.loops}
    assert loops["i"].parallel and loops["j"].parallel and not loops["k"].parallel
    assert loops["k"].reduction and not loops["i"].reduction
    assert {loops[name].band for name in "ijk"} == {0} and loops["i"].permutable and loops["j"].permutable
    # C[i, j] is contiguous along j only.
    assert loops["j"].vectorizable and not loops["i"].vectorizable and not loops["k"].vectorizable
    assert analysis.summary(analysis.program.statements[0]) == "carried only by the reduction loop k"
    assert analysis.exact


def test_a_skewed_dependence_makes_interchange_illegal() -> None:
    analysis = analyse_prim_func(_skewed_stencil, CACHES)
    (raw,) = [d for d in analysis.dependences if d.kind.value == "RAW"]
    assert raw.distance_text == "(1, -1)" and raw.carried_by == ("i",)
    loops = {loop.loop: loop for loop in analysis.loops}
    # i carries the dependence; j does not, but (1, -1) is negative on j: i and j are separate bands.
    assert not loops["i"].parallel and loops["j"].parallel
    assert loops["i"].band != loops["j"].band
    assert not loops["i"].permutable and not loops["j"].permutable
    assert "carried by i (spatial)" in analysis.summary(analysis.program.statements[0])


def test_softmax_fusion_depths() -> None:
    x = te.placeholder((4, 16), name="x")
    analysis = analyse_prim_func(te.create_prim_func([x, topi.nn.softmax(x)]), CACHES)
    names = [s.name for s in analysis.program.statements]
    assert names == ["T_softmax_maxelem", "T_softmax_exp", "T_softmax_expsum", "T_softmax_norm"]
    depths = {(f.producer, f.consumer): f.depth for f in analysis.fusions}
    # The row maximum needs the whole row: it can share only the row loop with exp.
    assert depths[("T_softmax_maxelem", "T_softmax_exp")] == 1
    # exp(x[i, k]) can be computed inside the sum's reduction loop, element by element.
    assert depths[("T_softmax_exp", "T_softmax_expsum")] == 2
    assert depths[("T_softmax_exp", "T_softmax_norm")] == 2
    assert depths[("T_softmax_expsum", "T_softmax_norm")] == 1
    for statement in analysis.program.statements:
        expected = "reduction" if statement.is_reduction else "parallel"
        assert expected in analysis.summary(statement)


def test_an_inexact_access_is_kept_as_a_box_and_reported() -> None:
    analysis = analyse_prim_func(_unpack, CACHES)
    (statement,) = analysis.program.statements
    a = next(x for x in statement.reads() if x.tensor.name == "A")
    assert not a.exact and a.box == ((0, 15), (0, 3))
    assert not analysis.exact
    assert any("not affine" in reason for reason in analysis.program.inexact)
    report = analysis.to_json()
    assert report["fallback"] and "stock space" in report["fallback"]
    # The box over-approximates: every element of A may be read by every iteration.
    assert "A[o0, o1]" in next(x["relation"] for x in report["accesses"] if x["tensor"] == "A")


def test_a_padding_read_is_clamped_to_the_tensor() -> None:
    x = te.placeholder((1, 8, 8, 4), name="x")
    program = extract_program(te.create_prim_func([x, topi.nn.pad(x, (0, 1, 1, 0), (0, 1, 1, 0))]))
    read = program.statements[0].reads()[0]
    assert read.exact and read.clamped and read.box == ((0, 0), (0, 7), (0, 7), (0, 3))


@pytest.mark.parametrize(
    ("stride", "dilation", "tile"),
    [(1, 1, [1, 4, 8, 16, 3, 3, 8]), (2, 1, [1, 2, 7, 16, 3, 1, 64]), (1, 1, [1, 1, 1, 64, 1, 1, 64])],
)
def test_the_closed_form_footprint_matches_isl(stride: int, dilation: int, tile: list[int]) -> None:
    x = te.placeholder((1, 58, 58, 64), name="x")
    w = te.placeholder((3, 3, 64, 64), name="w")
    y = topi.nn.conv2d_nhwc(x, w, stride, 0, dilation)
    ip = IslProgram(extract_program(te.create_prim_func([x, w, y])))
    conv = ip.statements[-1]
    assert tile_footprint(conv.statement, tile) == exact_tile_footprint(conv, tile)


def test_matmul_footprint_matches_isl_and_counts_each_tensor_once() -> None:
    ip = IslProgram(extract_program(_matmul(512, 512, 512)))
    (statement,) = ip.statements
    tile = [32, 64, 128]
    assert tile_footprint(statement.statement, tile) == {"A": 32 * 128, "B": 128 * 64, "C": 32 * 64}
    assert exact_tile_footprint(statement, tile) == tile_footprint(statement.statement, tile)


def test_a_dilated_window_is_over_approximated_never_under() -> None:
    x = te.placeholder((1, 20, 20, 8), name="x")
    w = te.placeholder((3, 3, 8, 8), name="w")
    y = topi.nn.conv2d_nhwc(x, w, 1, 0, 2)
    ip = IslProgram(extract_program(te.create_prim_func([x, w, y])))
    conv = ip.statements[-1]
    tile = [1, 1, 1, 8, 3, 3, 8]  # one output pixel: rows 0, 2, 4 of the window
    closed, exact = tile_footprint(conv.statement, tile), exact_tile_footprint(conv, tile)
    assert exact["pad_temp"] == 3 * 3 * 8
    assert closed["pad_temp"] >= exact["pad_temp"]
    assert closed["w"] == exact["w"]


def test_reuse_directions_are_the_null_space_of_the_access() -> None:
    program = extract_program(_matmul())
    (statement,) = program.statements
    by_tensor = {a.tensor.name: a for a in statement.reads()}
    assert reuse_directions(statement, by_tensor["A"]) == [(0, 1, 0)]  # A[i, k]: reused along j
    assert reuse_directions(statement, by_tensor["B"]) == [(1, 0, 0)]  # B[k, j]: along i
    assert reuse_directions(statement, by_tensor["C"]) == [(0, 0, 1)]  # C[i, j]: along k
    # x[i + j]: the same element along (1, -1).
    a = te.placeholder((32,), name="a")
    y = te.compute((16, 16), lambda i, j: a[i + j], name="y")
    (shifted,) = extract_program(te.create_prim_func([a, y])).statements
    assert reuse_directions(shifted, shifted.reads()[0]) == [(-1, 1)]


def test_cache_sizes_from_settings_and_sysfs(tmp_path: Path) -> None:
    spec = parse_cache_spec("L1d=48K, L2=1M, L3=32M")
    assert [(c.name, c.bytes) for c in spec.levels] == [("L1d", 48 << 10), ("L2", 1 << 20), ("L3", 32 << 20)]
    assert spec.source == "settings"
    with pytest.raises(ValueError, match="cannot read"):
        parse_cache_spec("L1d=lots")
    for index, (level, kind, size) in enumerate(
        [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "32768K")]
    ):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "type").write_text(f"{kind}\n")
        (folder / "size").write_text(f"{size}\n")
    caches = read_sysfs_caches(tmp_path)
    assert [(c.name, c.bytes) for c in caches.levels] == [
        ("L1d", 32 << 10),
        ("L2", 1 << 20),
        ("L3", 32 << 20),
    ]
    assert caches.source == "sysfs"
    assert read_sysfs_caches(tmp_path / "missing") is UNKNOWN


@pytest.mark.parametrize("kernel", ["conv3x3s2", "depthwise", "dilated"])
def test_the_closed_form_never_undercounts_on_random_tiles(kernel: str) -> None:
    import random

    x = te.placeholder((1, 30, 30, 16), name="x")
    if kernel == "depthwise":
        w = te.placeholder((3, 3, 16, 1), name="w")
        y = topi.nn.depthwise_conv2d_nhwc(x, w, 1, 1, 1)
    else:
        w = te.placeholder((3, 3, 16, 16), name="w")
        y = topi.nn.conv2d_nhwc(x, w, 2 if kernel == "conv3x3s2" else 1, 0, 3 if kernel == "dilated" else 1)
    func = te.create_prim_func([x, w, y])
    conv = IslProgram(extract_program(func)).statements[-1]
    rng = random.Random(0)
    for _ in range(12):
        tile = [rng.randint(1, loop.extent) for loop in conv.statement.loops]
        closed, exact = tile_footprint(conv.statement, tile), exact_tile_footprint(conv, tile)
        assert closed.keys() == exact.keys()
        for name in closed:
            assert closed[name] >= exact[name], (tile, name)
            if kernel != "dilated":
                assert closed[name] == exact[name], (tile, name)


def test_a_convolution_is_one_permutable_band_with_its_reductions_reorderable() -> None:
    x = te.placeholder((1, 16, 16, 8), name="x")
    w = te.placeholder((3, 3, 8, 8), name="w")
    analysis = analyse_prim_func(te.create_prim_func([x, w, topi.nn.conv2d_nhwc(x, w, 1, 1, 1)]), CACHES)
    conv = [loop for loop in analysis.loops if loop.statement == "conv2d_nhwc"]
    assert [loop.loop for loop in conv] == ["nn", "yy", "xx", "ff", "ry", "rx", "rc"]
    # Reordering ry, rx, rc only reassociates the sum: one band, all seven loops permutable.
    assert {loop.band for loop in conv} == {0} and all(loop.permutable for loop in conv)
    assert [loop.parallel for loop in conv] == [True] * 4 + [False] * 3
    assert [loop.reduction for loop in conv] == [False] * 4 + [True] * 3
    assert [loop.loop for loop in conv if loop.vectorizable] == ["ff"]
    summary = analysis.summary(analysis.program.statement("conv2d_nhwc"))
    assert summary == "carried only by the reduction loops ry, rx, rc"
