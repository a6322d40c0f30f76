"""A sample of ONNX's own backend node tests (the cases ``onnx.backend.test.case.node`` ships: a model, its
inputs, its expected outputs) through Kiln's whole ONNX path: import (folding, opset conversion, Kiln's
converters), Kiln's graph passes for this CPU, an untuned build, a run. Each must give the expected
outputs within the case's tolerances, and the values onnxruntime computes where onnxruntime computes
those (its causal attention is aligned differently from ONNX's reference in a few cases, and it has no
batch-first recurrences). The full suite is
``bench/conformance.py``; these are the operators Kiln added or fixed, and cases of each way Kiln's import
used to fail."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from kiln_tvm import ms
from tuner.compile import LoadedModel, build_tuned
from tuner.frontend import load_model
from tuner.passes.plan import plan_graph
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())

CASES = [
    # Kiln's converters
    "test_attention_4d",
    "test_attention_4d_gqa_causal",
    "test_attention_4d_attn_mask_bool",
    "test_attention_4d_with_past_and_present_qk_matmul_bias_4d_mask_causal",
    "test_attention_3d_gqa_with_past_and_present",
    "test_attention_3d_softcap",
    "test_attention_4d_with_qk_matmul_softmax",
    "test_attention_causal_boolmask_nan_robustness",
    "test_attention_local_window_gqa_rank4_mask",
    "test_attention_local_window_ext_cache_rank3_head_mask",
    "test_rotary_embedding",
    "test_rotary_embedding_3d_input",
    "test_rotary_embedding_with_interleaved_rotary_dim",
    "test_rotary_embedding_with_rotary_dim",
    "test_lstm_with_peepholes",
    "test_gru_seq_length",
    "test_simple_rnn_batchwise",
    "test_swish",
    "test_swiglu_alpha",
    "test_bitcast_float32_to_int32",
    "test_bitcast_bool_to_uint8",
    "test_dft_rfft_opset19",
    "test_dft_irfft_opset19",
    "test_celu",
    "test_lpnormalization_default",
    "test_rms_normalization_2d_axis0",
    "test_reversesequence_batch",
    "test_reversesequence_time",
    "test_scan9_sum",
    "test_scan9_multi_state",
    # values computed in the graph, folded before conversion
    "test_attention_4d_expanded",
    "test_layer_normalization_4d_axis1_expanded",
    "test_attention_3d_gqa_causal_expanded",
    # Kiln's passes and build on kernels TVM's layout rewrites used to fail on
    "test_max_two_inputs",
    "test_scatter_elements_with_axis",
    # onnxruntime expands a float16 Range into a Loop TVM lacks: that folding is not kept
    "test_range_float16_type_positive_delta",
    # Constant in its scalar and list forms (value_float...); an empty input; an old opset (7)
    "test_selu_expanded_ver18",
    "test_mvn_expanded_ver18",
    "test_castlike_FLOAT_to_DOUBLE",
    "test_and2d",
    # TVM's converters replaced where they get a form wrong
    "test_layer_normalization_4d_axis_negative_1",
    "test_pow_types_float32_int64",
    "test_pow_types_int32_float32",
    "test_eyelike_with_dtype",
]


#: Cases whose parameters (a shape, axes, k, a frame step) are graph inputs, run as a user runs such a
#: model: those inputs bound at import (``--input-value``), the others fed.
BOUND_CASES = {
    "test_stft": ("frame_step", "frame_length"),
    "test_stft_with_window": ("frame_step",),
    "test_dft_rfft": ("axis",),
    "test_cumprod_1d_reverse_exclusive": ("axis",),
    "test_reshape_reduced_dims": ("shape",),
    "test_reduce_sum_keepdims_random": ("axes",),
    "test_top_k_smallest": ("k",),
    "test_resize_downsample_sizes_linear_pytorch_half_pixel": ("sizes",),
    "test_resize_upsample_sizes_nearest_axes_2_3": ("sizes",),
    "test_resize_downsample_sizes_nearest_not_larger": ("sizes",),
    "test_onehot_negative_indices": ("depth", "values"),
    "test_reduce_max_bool_inputs": ("axes",),
    "test_center_crop_pad_crop_and_pad": ("shape",),
    "test_melweightmatrix": (
        "num_mel_bins",
        "dft_length",
        "sample_rate",
        "lower_edge_hertz",
        "upper_edge_hertz",
    ),
    "test_hannwindow": ("x",),
    "test_tile": ("y",),
}


@functools.cache
def _all_cases() -> dict[str, Any]:
    import onnx.backend.test.case.node as node_cases

    return {case.name: case for case in node_cases.collect_testcases()}


def _array(value: Any) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def _kiln(
    model: onnx.ModelProto, inputs: list[np.ndarray], tmp_path: Path, bound: tuple[str, ...] = ()
) -> list[np.ndarray]:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    initializers = {t.name for t in model.graph.initializer}
    names = [v.name for v in model.graph.input if v.name not in initializers]
    values = {n: a.tolist() for n, a in zip(names, inputs, strict=True) if n in bound}
    fed = [(n, a) for n, a in zip(names, inputs, strict=True) if n not in bound]
    imported = load_model(path, {n: a.shape for n, a in fed}, input_values=values)
    assert [t.name for t in imported.signature.inputs] == [n for n, _ in fed]
    plan = plan_graph(imported.mod, TARGET)
    return LoadedModel(build_tuned(plan, TARGET, ms.database.MemoryDatabase())).run([a for _, a in fed])


@pytest.mark.parametrize("name", CASES + list(BOUND_CASES))
def test_node_case(name: str, tmp_path: Path) -> None:
    case = _all_cases().get(name)
    if case is None:
        pytest.skip(f"this onnx wheel ({onnx.__version__}) has no node test {name}")
    for raw_inputs, raw_expected in case.data_sets:
        inputs = [_array(x) for x in raw_inputs]
        expected = [_array(x) for x in raw_expected]
        got = _kiln(case.model, inputs, tmp_path, BOUND_CASES.get(name, ()))
        assert len(got) == len(expected)
        from_onnxruntime = _onnxruntime(case.model, inputs) or [None] * len(expected)
        for g, e, o in zip(got, expected, from_onnxruntime, strict=True):
            assert g.shape == e.shape and g.dtype == e.dtype
            np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol)
            if o is not None and _close(o, e, case.rtol, case.atol):  # onnxruntime computes what ONNX says
                np.testing.assert_allclose(g, o, rtol=max(case.rtol, 1e-5), atol=max(case.atol, 1e-6))


def _onnxruntime(model: onnx.ModelProto, inputs: list[np.ndarray]) -> list[np.ndarray] | None:
    """onnxruntime's outputs, or None for a model it does not run (batch-first recurrences)."""
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.NotImplemented):
        return None
    feeds = dict(zip([i.name for i in session.get_inputs()], inputs, strict=True))
    return session.run(None, feeds)


def _close(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> bool:
    try:
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize(("length", "dtype"), [(8, np.float32), (4, np.float32), (8, np.float64)])
def test_dft_length_pads_or_cuts_the_signal(length: int, dtype: type, tmp_path: Path) -> None:
    """``DFT`` (opset 20) with a constant ``dft_length``: the signal zero-padded or cut to it, as
    ``numpy.fft.fft(x, n=length)`` computes, in the signal's own precision."""
    from onnx import TensorProto, helper

    elem = TensorProto.DOUBLE if dtype is np.float64 else TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("DFT", ["x", "n", "axis"], ["y"])],
        "dft",
        [helper.make_tensor_value_info("x", elem, [2, 6, 1])],
        [helper.make_tensor_value_info("y", elem, [2, length, 2])],
        [
            numpy_helper.from_array(np.array(length, dtype=np.int64), "n"),
            numpy_helper.from_array(np.array(1, dtype=np.int64), "axis"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    x = np.random.default_rng(3).standard_normal((2, 6, 1)).astype(dtype)
    (got,) = _kiln(model, [x], tmp_path)
    spectrum = np.fft.fft(x[..., 0].astype(np.float64), n=length, axis=1)
    assert got.dtype == dtype and got.shape == (2, length, 2)
    tolerance = 1e-12 if dtype is np.float64 else 1e-5
    np.testing.assert_allclose(
        got, np.stack([spectrum.real, spectrum.imag], -1), rtol=tolerance, atol=tolerance
    )


def test_a_layer_norm_without_statistics_outputs_imports_as_one_operator(tmp_path: Path) -> None:
    """Only a node that has the ``Mean`` / ``InvStdDev`` outputs gets them computed: a transformer's layer
    norms import as TVM's one fused operator, and the plan's operator count says so."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 64])],
        [
            numpy_helper.from_array(np.ones(64, np.float32), "g"),
            numpy_helper.from_array(np.zeros(64, np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "ln.onnx"
    onnx.save(model, path)
    plan = plan_graph(load_model(path).mod, TARGET)
    assert plan.fusion.operator_histogram == {"relax.nn.layer_norm": 1}
