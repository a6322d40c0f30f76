"""GELU written out as its formula (so that fast math reaches its erf/tanh) computes what TVM's GELU does."""

from __future__ import annotations

import numpy as np
import pytest

from kiln_tvm import relax, tvm
from tuner.compile import LoadedModel
from tuner.passes.activations import gelu_as_formula


def _module(op: str) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(getattr(relax.op.nn, op)(x)))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    return LoadedModel(tvm.compile(mod, target=tvm.target.Target("llvm"))).run([x])[0]


@pytest.mark.parametrize("op", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast-math"])
def test_formula_matches_tvms_gelu(op: str, fast: bool) -> None:
    mod = _module(op)
    rewritten = gelu_as_formula()(mod)
    assert f"R.nn.{op}(" not in rewritten.script()
    if fast:
        rewritten = relax.transform.FastMathTransform()(rewritten)
        assert "fast_" in rewritten.script()  # the erf / tanh is now the approximation
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32) * 4
    np.testing.assert_allclose(_run(rewritten, x), _run(mod, x), rtol=1e-5, atol=1e-5)
