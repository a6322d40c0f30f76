"""``tile`` through Kiln's graph passes: TVM's own ``topi.tile`` computes wrong values when several axes are
tiled into a large enough result; Kiln's rewrite as a broadcast computes what numpy does."""

from __future__ import annotations

import numpy as np
import pytest

from kiln_tvm import ms, relax
from tuner.compile import LoadedModel, build_tuned
from tuner.passes.plan import plan_graph
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())


def _tile_module(shape: tuple[int, ...], reps: list[int]) -> relax.Function:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.tile(x, reps)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    ("shape", "reps"),
    [((2, 3, 4, 5), [7, 6, 4, 2]), ((2, 3, 4, 5), [4, 4, 4, 4]), ((3, 4), [2, 1, 3]), ((2, 3, 4), [5])],
)
def test_tile_computes_what_numpy_does(shape: tuple[int, ...], reps: list[int]) -> None:
    plan = plan_graph(_tile_module(shape, reps), TARGET)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    (got,) = LoadedModel(build_tuned(plan, TARGET, ms.database.MemoryDatabase())).run([x])
    np.testing.assert_array_equal(got, np.tile(x, reps))
