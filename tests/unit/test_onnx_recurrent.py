"""Kiln's LSTM, GRU and RNN converters (unrolled over the static sequence) against onnxruntime (ONNX's
reference implementation for the batch-first layout, which onnxruntime lacks), over the
attributes ONNX's own node tests leave out: both directions with biases and initial states, batch-first
layout, peepholes, ``clip``, ``linear_before_reset``, other activations, and run-time ``sequence_lens``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.onnx_import import assert_outputs_match, untuned_outputs

SEQ, BATCH, FEATURES, HIDDEN = 5, 3, 4, 6
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _model(
    kind: str, attrs: dict, with_state: bool, with_lens: bool, peepholes: bool
) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(7)
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    gates = GATES[kind]
    batch_first = attrs.get("layout", 0) == 1
    x_shape = (BATCH, SEQ, FEATURES) if batch_first else (SEQ, BATCH, FEATURES)
    state_shape = (BATCH, dirs, HIDDEN) if batch_first else (dirs, BATCH, HIDDEN)
    feeds: dict[str, np.ndarray] = {"X": rng.standard_normal(x_shape).astype(np.float32)}
    weights = {
        "W": rng.standard_normal((dirs, gates * HIDDEN, FEATURES)).astype(np.float32) * 0.5,
        "R": rng.standard_normal((dirs, gates * HIDDEN, HIDDEN)).astype(np.float32) * 0.5,
        "B": rng.standard_normal((dirs, 2 * gates * HIDDEN)).astype(np.float32) * 0.3,
    }
    names = ["X", "W", "R", "B", "", "", "", ""]
    if with_lens:
        feeds["sequence_lens"] = np.array([5, 2, 4], dtype=np.int32)
        names[4] = "sequence_lens"
    if with_state:
        feeds["initial_h"] = rng.standard_normal(state_shape).astype(np.float32)
        names[5] = "initial_h"
        if kind == "LSTM":
            feeds["initial_c"] = rng.standard_normal(state_shape).astype(np.float32)
            names[6] = "initial_c"
    if peepholes:
        weights["P"] = rng.standard_normal((dirs, 3 * HIDDEN)).astype(np.float32) * 0.3
        names[7] = "P"
    names = names[: 8 if kind == "LSTM" else 6]
    while names and names[-1] == "":
        names.pop()
    outputs = ["Y", "Y_h", "Y_c"] if kind == "LSTM" else ["Y", "Y_h"]
    node = helper.make_node(kind, names, outputs, hidden_size=HIDDEN, **attrs)
    inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for n, v in feeds.items()
    ]
    inits = [onnx.numpy_helper.from_array(v, n) for n, v in weights.items()]
    graph = helper.make_graph(
        [node],
        "recurrent",
        inputs,
        [
            helper.make_tensor_value_info(o, TensorProto.FLOAT, ["a", "b", "c", "d"][: 4 if o == "Y" else 3])
            for o in outputs
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model, feeds


CASES = [
    ("LSTM", {"direction": "bidirectional"}, True, False, False),
    ("LSTM", {"layout": 1}, True, False, True),
    ("LSTM", {"clip": 0.7, "input_forget": 1}, False, False, True),
    ("LSTM", {}, True, True, False),
    ("GRU", {"direction": "bidirectional", "linear_before_reset": 1}, True, False, False),
    (
        "GRU",
        {
            "direction": "reverse",
            "activations": ["HardSigmoid", "LeakyRelu"],
            "activation_alpha": [0.3, 0.05],
            "activation_beta": [0.4],
        },
        False,
        False,
        False,
    ),
    ("GRU", {"layout": 1}, True, False, False),
    ("GRU", {}, True, True, False),
    ("RNN", {"direction": "bidirectional", "activations": ["Relu", "Tanh"]}, True, False, False),
    ("RNN", {"clip": 0.5}, False, True, False),
]


@pytest.mark.parametrize(("kind", "attrs", "with_state", "with_lens", "peepholes"), CASES)
def test_recurrent_against_onnxruntime(
    kind: str, attrs: dict, with_state: bool, with_lens: bool, peepholes: bool, tmp_path: Path
) -> None:
    model, feeds = _model(kind, attrs, with_state, with_lens, peepholes)
    path = tmp_path / "recurrent.onnx"
    onnx.save(model, path)
    if attrs.get("layout") == 1:  # onnxruntime has no batch-first recurrences: ONNX's reference instead
        from onnx.reference import ReferenceEvaluator

        expected = ReferenceEvaluator(model).run(None, feeds)
    else:
        expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert_outputs_match(untuned_outputs(path, feeds), expected, rtol=1e-4, atol=1e-5)
