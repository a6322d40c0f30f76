"""The analytic register-tiled schedules (schedules/analytic.py): the tile each ISA gets, and matmuls,
batched matmuls and convolutions built with them computing the right result at several shapes (odd extents
included) on this CPU, and building for the other CPU classes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kiln_tvm import ms, relax, tvm
from schedules.analytic import analytic_schedule, register_tile
from schedules.isa import IsaProfile, isa_profile
from schedules.poly.caches import host_caches
from schedules.poly.search import traced_tilings
from tuner.schedule_choice import ScheduleSource, task_context, untuned_schedule
from tuner.targets import host_target, to_tvm_target

AVX2 = IsaProfile(frozenset({"avx", "avx2", "fma"}))
AVX512 = IsaProfile(frozenset({"avx", "avx2", "fma", "avx512f"}))

HOST = to_tvm_target(host_target())
#: CPU classes the schedules are built for, whatever this machine is.
OTHER_CPUS = {
    "AVX2 (haswell)": {"kind": "llvm", "mcpu": "haswell", "num-cores": 2},
    "AVX-512 (skylake-avx512)": {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2},
}


def test_the_register_tile_fills_the_vector_registers_of_each_isa() -> None:
    # AVX2: 16 ymm registers of 8 lanes; 4 rows x 2 vectors = 8 accumulators, 2 weight vectors, 1 broadcast.
    avx2 = register_tile([128], 768, AVX2)
    assert (avx2.rows, avx2.vectors, avx2.columns) == (4, 2, 16)
    # AVX-512: 32 zmm registers of 16 lanes: 8 rows x 3 vectors (24 accumulators + 3 + 1, two to spare).
    avx512 = register_tile([128], 768, AVX512)
    assert (avx512.rows, avx512.vectors, avx512.columns) == (8, 3, 48)
    # Rows come from the next outer axis when the innermost has no divisor to give (a 14x14 image: 2 x 2).
    image = register_tile([14, 14], 256, AVX2)
    assert (image.row_factors, image.vectors) == ((2, 2), 2)
    # A prime extent (ViT's 197 tokens) gives one row; the tile takes the most vectors instead.
    prime = register_tile([197], 384, AVX2)
    assert (prime.rows, prime.vectors) == (1, 4)
    # No whole vector in the innermost axis: the rule does not apply.
    assert register_tile([64], 12, AVX2) is None


def _task(build: Callable[[relax.BlockBuilder, list[Any]], Any], shapes: list[tuple[int, ...]]) -> Any:
    """The one tiled task of a Relax function over float32 inputs of ``shapes``."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(build(bb, params)))
        bb.emit_func_output(out)
    mod = relax.get_pipeline("zero")(bb.get())
    tasks = [
        t
        for t in ms.relax_integration.extract_tasks(mod, HOST)
        if "matmul" in str(t.task_name) or "conv" in str(t.task_name)
    ]
    (task,) = tasks
    return task.dispatched[0]


def _matmul_bias(m: int, k: int, n: int) -> Any:
    return _task(lambda bb, p: relax.op.add(relax.op.matmul(p[0], p[1]), p[2]), [(m, k), (k, n), (n,)])


def _batch_matmul(b: int, m: int, k: int, n: int) -> Any:
    return _task(lambda bb, p: relax.op.matmul(p[0], p[1]), [(b, m, k), (b, k, n)])


def _conv_nhwc(hw: int, cin: int, cout: int, kernel: int) -> Any:
    return _task(
        lambda bb, p: relax.op.nn.relu(
            relax.op.nn.conv2d(p[0], p[1], padding=kernel // 2, data_layout="NHWC", kernel_layout="OHWI")
        ),
        [(1, hw, hw, cin), (cout, kernel, kernel, cin)],
    )


KERNELS = {
    "matmul 128x768x768 + bias": lambda: _matmul_bias(128, 768, 768),
    "matmul 7x13x24 + bias (odd rows and depth)": lambda: _matmul_bias(7, 13, 24),
    "matmul 33x65x40 + bias": lambda: _matmul_bias(33, 65, 40),
    "batched matmul 3x17x64x32": lambda: _batch_matmul(3, 17, 64, 32),
    "conv 3x3 14x14, 32 -> 64 channels": lambda: _conv_nhwc(14, 32, 64, 3),
    "conv 7x7 15x15, 3 -> 16 channels": lambda: _conv_nhwc(15, 3, 16, 7),
    "conv 1x1 9x9, 24 -> 8 channels": lambda: _conv_nhwc(9, 24, 8, 1),
}


def _run(mod: Any, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    infos = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    arrays = [rng.standard_normal([int(d) for d in a.shape]).astype("float32") for a in infos]
    args = [tvm.runtime.tensor(a) for a in arrays]
    tvm.compile(mod, target=HOST)["main"](*args)
    return arrays, args[-1].numpy()


@pytest.mark.parametrize("name", list(KERNELS))
def test_an_analytic_schedule_computes_what_the_unscheduled_kernel_does(name: str) -> None:
    if isa_profile(HOST).fp32_lanes < 8:
        pytest.skip("this CPU has no AVX: the analytic tiles are built for 8- and 16-lane vectors")
    mod = KERNELS[name]()
    source, sch = untuned_schedule(mod, HOST, name, host_caches())
    assert source is ScheduleSource.ANALYTIC, source
    _, want = _run(mod)
    _, got = _run(sch.mod)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # Not the unscheduled loops: the innermost output axis is vectorized, the work parallel.
    text = sch.mod.script()
    assert "T.vectorized" in text and "T.parallel" in text


@pytest.mark.slow
@pytest.mark.parametrize("cpu", list(OTHER_CPUS))
def test_analytic_schedules_build_for_the_other_cpu_classes(cpu: str) -> None:
    target = to_tvm_target(OTHER_CPUS[cpu])
    lanes = isa_profile(target).fp32_lanes
    # The tile's columns are whole vectors of that CPU: 2 of 8 lanes on AVX2; on AVX-512 3 of 16 where the
    # width allows (768), else 4 (64 channels, with 4 rows: 16 accumulators).
    expected = {
        "matmul 128x768x768 + bias": {8: 16, 16: 48},
        "conv 3x3 14x14, 32 -> 64 channels": {8: 16, 16: 64},
    }
    for name, columns_per_lanes in expected.items():
        mod = KERNELS[name]()
        sch = analytic_schedule(
            task_context(mod, target, name, "cpu", caches=host_caches(), cores=2), isa_profile(target)
        )
        assert sch is not None, (cpu, name)
        text = sch.mod.script()
        assert "T.vectorized" in text, (cpu, name)
        tvm.compile(sch.mod, target=target)  # builds for that CPU (not run where this one lacks it)
        (tiled,) = traced_tilings(sch.trace)
        columns = [f for f in tiled.factors if len(f) == 4][-1][-1]
        assert columns == columns_per_lanes[lanes], (cpu, name, tiled.factors)


def test_a_kernel_without_a_whole_vector_falls_back_to_the_other_schedules() -> None:
    mod = _matmul_bias(16, 32, 12)  # 12 output columns: no whole 8- or 16-lane vector
    source, sch = untuned_schedule(mod, HOST, "narrow matmul", host_caches())
    assert source is not ScheduleSource.ANALYTIC and sch is not None
    _, want = _run(mod)
    _, got = _run(sch.mod)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("mcpu", "lanes", "registers", "amx", "dpbf16"),
    [
        ("haswell", 8, 16, False, False),
        ("znver3", 8, 16, False, False),
        ("skylake-avx512", 16, 32, False, False),
        ("znver4", 16, 32, False, True),
        ("sapphirerapids", 16, 32, True, True),
    ],
)
def test_one_isa_profile_answers_for_every_cpu_class(
    mcpu: str, lanes: int, registers: int, amx: bool, dpbf16: bool
) -> None:
    profile = isa_profile(to_tvm_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2}))
    assert (profile.fp32_lanes, profile.vector_registers) == (lanes, registers)
    assert profile.fma and profile.amx_int8 is amx and profile.amx_bf16 is amx
    assert profile.avx512_bf16 is dpbf16
    # An explicit feature the CPU name lacks counts (a hypervisor naming an older part).
    extra = isa_profile(
        to_tvm_target({"kind": "llvm", "mcpu": "haswell", "mattr": ["+avx512f"], "num-cores": 2})
    )
    assert extra.fp32_lanes == 16
    assert not isa_profile(to_tvm_target({"kind": "cuda"})).features
