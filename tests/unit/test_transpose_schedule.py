"""The transpose rule: a reshape-and-transpose that moves the input's contiguous axis away from the
output's innermost is tiled and vectorized and computes the same; kernels that are not such a
transposition are left to the search."""

from __future__ import annotations

import numpy as np
import pytest

from kiln_tvm import ms, s_tir, structural_equal, tvm
from schedules.defaults import default_schedule
from schedules.loops import fp32_lanes
from schedules.transpose import transpose_schedule
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())
te, topi = tvm.te, tvm.topi


def _key_transpose() -> tvm.IRModule:
    """The BERT-style encoder's key split into heads, transposed for Q.K^T: [1,128,256] -> [1,4,64,128]."""
    x = te.placeholder((1, 128, 256), name="x")
    heads = topi.reshape(x, (1, 128, 4, 64))
    return tvm.IRModule({"main": te.create_prim_func([x, topi.transpose(heads, (0, 2, 3, 1))])})


def _run(mod: tvm.IRModule) -> np.ndarray:
    rng = np.random.default_rng(0)
    args = [
        tvm.runtime.tensor(rng.standard_normal([int(d) for d in a.shape]).astype(str(a.dtype)))
        for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    ]
    tvm.compile(mod, target=TARGET)(*args)
    return args[-1].numpy()


def test_a_head_transpose_is_tiled_vectorized_and_computes_the_same() -> None:
    mod = _key_transpose()
    sch = default_schedule(mod, TARGET)
    assert sch is not None
    replayed = s_tir.Schedule(mod)
    sch.trace.apply_to_schedule(replayed, remove_postproc=False)
    assert structural_equal(replayed.mod, sch.mod)
    np.testing.assert_array_equal(_run(sch.mod), _run(mod))
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    loops = [sch.get(loop) for loop in sch.get_loops(block)]
    assert loops[0].kind == tvm.tirx.ForKind.PARALLEL
    assert loops[-1].kind == tvm.tirx.ForKind.VECTORIZED and int(loops[-1].extent) == fp32_lanes(TARGET)
    # Tiles of lanes x lanes: the loop above the vector loop walks the input's contiguous axis.
    assert int(loops[-2].extent) == fp32_lanes(TARGET)


@pytest.mark.parametrize(
    "build",
    [
        # NCHW -> NHWC with 3 channels: the output's innermost axis is narrower than a vector.
        lambda: [x := te.placeholder((1, 3, 32, 32), name="x"), topi.transpose(x, (0, 2, 3, 1))],
        # Heads split without moving the contiguous axis: already contiguous on both sides.
        lambda: [
            x := te.placeholder((1, 128, 256), name="x"),
            topi.transpose(topi.reshape(x, (1, 128, 4, 64)), (0, 2, 1, 3)),
        ],
        # Elementwise over two inputs.
        lambda: [
            a := te.placeholder((64, 64), name="a"),
            b := te.placeholder((64, 64), name="b"),
            topi.add(a, b),
        ],
    ],
    ids=["narrow-channels", "contiguous", "two-inputs"],
)
def test_other_data_movement_is_left_to_the_search(build) -> None:  # noqa: ANN001
    func = te.create_prim_func(build())
    assert transpose_schedule(func, TARGET) is None
