"""Quantized elementwise chains become 256-entry tables that compute what the chain computes, and fuse into
the epilogue of the layer before them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kiln_tvm import relax
from tests.quant_models import TARGET, QuantSpec, build_qdq_net, plan_and_compare
from tuner.compile import LoadedModel, build_untuned
from tuner.passes.qdq_lowering import QuantReport
from tuner.passes.qdq_tables import LOOKUP_ATTR, tabulate_qdq_chains


def _calls(func: relax.Function) -> list[str]:
    names: list[str] = []

    def visit(expr: object) -> None:
        if isinstance(expr, relax.Call) and hasattr(expr.op, "name"):
            names.append(str(expr.op.name))

    relax.analysis.post_order_visit(func.body, visit)
    return names


@pytest.mark.parametrize("act_dtype", ["int8", "uint8"])
@pytest.mark.parametrize("chain", ["gelu", "tanh", "requantize"])
def test_a_quantized_chain_is_one_table_and_matches_onnxruntime(
    chain: str, act_dtype: str, tmp_path: Path
) -> None:
    spec = QuantSpec(act_dtype=act_dtype, activation=None, chain=chain)
    plan = plan_and_compare(build_qdq_net("matmul", spec), tmp_path, optimized_steps=None)
    tables = [op for op in plan.fusion.integer_ops if "256-entry table" in op]
    operators = {"gelu": 13, "tanh": 3, "requantize": 6}[chain]
    kind = {"gelu": "erf chain", "tanh": "tanh chain", "requantize": "requantization chain"}[chain]
    assert tables == [f"{kind} 4x24 {act_dtype} -> {act_dtype}: {operators} operators as a 256-entry table"]
    calls = _calls(plan.prepared["main"])
    assert not {"relax.erf", "relax.tanh"} & set(calls), plan.prepared["main"]
    # The lookup kernel is fused into the first layer's epilogue: no kernel of its own.
    fused = [
        func
        for gvar, func in plan.lowered.functions.items()
        if "table" in gvar.name_hint and "matmul" in gvar.name_hint
    ]
    assert len(fused) == 1 and not [g for g in plan.lowered.get_global_vars() if g.name_hint == "qdq_table"]


def _chain_module(dtype: str, chain: str) -> relax.Function:
    """``q -> dequantize -> chain -> quantize`` over the 256 values of an 8-bit tensor."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((256,), dtype))
    zero = relax.const(np.array(3 if dtype == "int8" else 131, dtype))
    with bb.function("main", [q]):
        with bb.dataflow():
            x = bb.emit(relax.op.dequantize(q, relax.const(np.float32(0.05)), zero, out_dtype="float32"))
            if chain == "erf":
                y = bb.emit(relax.op.erf(bb.emit(relax.op.divide(x, relax.const(np.float32(1.4142135))))))
                y = bb.emit(relax.op.quantize(y, relax.const(np.float32(0.0079)), zero, out_dtype=dtype))
                y = bb.emit(
                    relax.op.dequantize(y, relax.const(np.float32(0.0079)), zero, out_dtype="float32")
                )
                y = bb.emit(relax.op.multiply(x, y))
            else:  # arithmetic only: computed exactly in float32 by either side
                y = bb.emit(relax.op.multiply(x, relax.const(np.float32(0.37))))
                y = bb.emit(relax.op.quantize(y, relax.const(np.float32(0.02)), zero, out_dtype=dtype))
                y = bb.emit(relax.op.dequantize(y, relax.const(np.float32(0.02)), zero, out_dtype="float32"))
                y = bb.emit(relax.op.add(y, relax.const(np.float32(-0.6))))
            out = bb.emit_output(relax.op.quantize(y, relax.const(np.float32(0.031)), zero, out_dtype=dtype))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("chain", ["arithmetic", "erf"])
def test_the_table_holds_what_tvm_computes_for_each_of_the_256_inputs(dtype: str, chain: str) -> None:
    mod = _chain_module(dtype, chain)
    report = QuantReport()
    tabulated = tabulate_qdq_chains(report)(mod)
    assert len(report.lowered) == 1 and "relax.quantize" not in _calls(tabulated["main"])
    assert [f for f in tabulated.functions.values() if f.attrs and LOOKUP_ATTR in f.attrs]
    info = np.iinfo(dtype)
    values = np.arange(info.min, info.max + 1).astype(dtype)
    np.random.default_rng(0).shuffle(values)  # the table is indexed by value, not by position
    expected = LoadedModel(build_untuned(mod, TARGET)).run([values])[0]
    got = LoadedModel(build_untuned(tabulated, TARGET)).run([values])[0]
    assert got.dtype == expected.dtype == np.dtype(dtype)
    steps = np.abs(got.astype(np.int32) - expected.astype(np.int32))
    if chain == "arithmetic":
        np.testing.assert_array_equal(got, expected)
    else:  # libm's erff and the table's float64 erf may round differently on a tie
        assert steps.max() <= 1 and (steps > 0).sum() <= 2, steps


def _declined(build: object) -> QuantReport:
    report = QuantReport()
    tabulate_qdq_chains(report)(build())  # type: ignore[operator]
    return report


def test_chains_that_are_not_functions_of_one_8bit_tensor_stay() -> None:
    def per_channel_constant() -> relax.IRModule:
        bb = relax.BlockBuilder()
        q = relax.Var("q", relax.TensorType((4, 8), "uint8"))
        with bb.function("main", [q]):
            with bb.dataflow():
                x = bb.emit(relax.op.dequantize(q, relax.const(np.float32(0.05)), relax.const(np.uint8(3))))
                x = bb.emit(
                    relax.op.tanh(bb.emit(relax.op.add(x, relax.const(np.arange(8, dtype="float32")))))
                )
                out = bb.emit_output(
                    relax.op.quantize(x, relax.const(np.float32(0.01)), relax.const(np.uint8(128)))
                )
            bb.emit_func_output(out)
        return bb.get()

    def float_input() -> relax.IRModule:
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((4, 8), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(
                    relax.op.quantize(
                        bb.emit(relax.op.tanh(x)), relax.const(np.float32(0.01)), relax.const(np.uint8(128))
                    )
                )
            bb.emit_func_output(out)
        return bb.get()

    def plain_requantization() -> relax.IRModule:  # one rounding, no transcendental: cheaper computed
        bb = relax.BlockBuilder()
        q = relax.Var("q", relax.TensorType((4, 8), "uint8"))
        with bb.function("main", [q]):
            with bb.dataflow():
                x = bb.emit(relax.op.dequantize(q, relax.const(np.float32(0.05)), relax.const(np.uint8(3))))
                out = bb.emit_output(
                    relax.op.quantize(x, relax.const(np.float32(0.01)), relax.const(np.uint8(128)))
                )
            bb.emit_func_output(out)
        return bb.get()

    for build in (per_channel_constant, float_input, plain_requantization):
        assert _declined(build).lowered == [], build.__name__
