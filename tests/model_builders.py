"""Small, seeded models shared by the tests and by ``examples/make_examples.py``.

ONNX builders use only ``onnx.helper`` and NumPy. The PyTorch builders import torch lazily, so this
module imports without the ``torch`` extra.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

if TYPE_CHECKING:
    import torch

OPSET = 17
IR_VERSION = 8  # the oldest IR that opset 17 allows, so older runtimes read the files too

Batch = int | str  # a fixed batch size, or the name of a dynamic batch dimension


def _he(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """Kaiming-normal weights: keeps activations near unit scale through ReLU layers."""
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def _small(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 0.1) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _model(graph: onnx.GraphProto, opset: int = OPSET) -> onnx.ModelProto:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="kiln-tests"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def build_mlp(batch: Batch = 1, seed: int = 0) -> onnx.ModelProto:
    """MLP: input ``x`` [batch, 256] -> Gemm 256x512 + Relu -> Gemm 512x10 -> output ``y`` [batch, 10]."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(_he(rng, (256, 512), 256), "fc1.weight"),
        numpy_helper.from_array(_small(rng, (512,)), "fc1.bias"),
        numpy_helper.from_array(_he(rng, (512, 10), 512), "fc2.weight"),
        numpy_helper.from_array(_small(rng, (10,)), "fc2.bias"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["fc1"], name="fc1"),
        helper.make_node("Relu", ["fc1"], ["relu1"], name="relu1"),
        helper.make_node("Gemm", ["relu1", "fc2.weight", "fc2.bias"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    return _model(graph)


def build_cancelling_matmuls(batch: int = 4, seed: int = 0) -> onnx.ModelProto:
    """``y = x @ W - x @ (W (1 + 1e-3))``, ``x`` [batch, 64], ``y`` [batch, 32]: in float32 a thousandth of
    ``x @ W``; with bf16 operands (a relative spacing of 2^-7) most of both weights round to the same values
    and the difference is mostly rounding: a model no bf16 policy can keep within its tolerance."""
    rng = np.random.default_rng(seed)
    weight = _he(rng, (64, 32), 64)
    inits = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array((weight * np.float32(1 + 1e-3)).astype(np.float32), "w_near"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="a"),
        helper.make_node("MatMul", ["x", "w_near"], ["b"], name="b"),
        helper.make_node("Sub", ["a", "b"], ["y"], name="difference"),
    ]
    graph = helper.make_graph(
        nodes,
        "cancelling_matmuls",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 32])],
        inits,
    )
    return _model(graph)


def build_attention_scores(seq: int = 64, hidden: int = 32, seed: int = 0) -> onnx.ModelProto:
    """Attention-style block: ``x`` [1, seq, hidden] -> layer norm -> scores x.xT / sqrt(hidden) -> Softmax
    (last axis) -> scores @ x -> GELU (erf form) -> output ``y`` [1, seq, hidden]. Two reductions (layer
    norm, softmax) between matmuls, and the transcendental functions fast math replaces (exp, erf)."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((1.0 + _small(rng, (hidden,))).astype(np.float32), "ln.weight"),
        numpy_helper.from_array(_small(rng, (hidden,)), "ln.bias"),
        numpy_helper.from_array(np.array(1.0 / np.sqrt(hidden), dtype=np.float32), "scale"),
        numpy_helper.from_array(np.array(1.0 / np.sqrt(2.0), dtype=np.float32), "inv_sqrt2"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half"),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "ln.weight", "ln.bias"], ["h"], axis=-1, epsilon=1e-5),
        helper.make_node("Transpose", ["h"], ["hT"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["h", "hT"], ["raw"]),
        helper.make_node("Mul", ["raw", "scale"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "h"], ["m"]),
        helper.make_node("Mul", ["m", "inv_sqrt2"], ["m_scaled"]),
        helper.make_node("Erf", ["m_scaled"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["erf1"]),
        helper.make_node("Mul", ["m", "erf1"], ["gelu2"]),
        helper.make_node("Mul", ["gelu2", "half"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attention_scores",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        inits,
    )
    return _model(graph)


def build_small_cnn(
    batch: Batch = 1, seed: int = 0, image_size: int = 32, activation: str = "Relu"
) -> onnx.ModelProto:
    """Small CNN on input ``x`` [batch, 3, H, W] with H = W = ``image_size``.

    Conv 3->16 3x3 pad 1 + BatchNormalization + Relu, Conv 16->32 3x3 stride 2 pad 1 + BN + Relu,
    Conv 32->32 3x3 pad 1 + Relu, GlobalAveragePool, Flatten, Gemm 32->10 -> output ``y`` [batch, 10].
    ``activation``: the ONNX operator in place of each Relu (e.g. ``Sigmoid``: other fused epilogues).
    """
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def add(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array, name))
        return name

    def conv(x: str, name: str, c_in: int, c_out: int, stride: int) -> str:
        w = add(f"{name}.weight", _he(rng, (c_out, c_in, 3, 3), c_in * 9))
        b = add(f"{name}.bias", _small(rng, (c_out,)))
        nodes.append(
            helper.make_node(
                "Conv",
                [x, w, b],
                [name],
                name=name,
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[stride, stride],
            )
        )
        return name

    def batch_norm(x: str, name: str, c: int) -> str:
        scale = add(f"{name}.scale", (1.0 + _small(rng, (c,))).astype(np.float32))
        bias = add(f"{name}.bias", _small(rng, (c,)))
        mean = add(f"{name}.mean", _small(rng, (c,)))
        var = add(f"{name}.var", rng.uniform(0.5, 1.5, (c,)).astype(np.float32))
        nodes.append(
            helper.make_node(
                "BatchNormalization", [x, scale, bias, mean, var], [name], name=name, epsilon=1e-5
            )
        )
        return name

    def relu(x: str, name: str) -> str:
        nodes.append(helper.make_node(activation, [x], [name], name=name))
        return name

    h = relu(batch_norm(conv("x", "conv1", 3, 16, 1), "bn1", 16), "relu1")
    h = relu(batch_norm(conv(h, "conv2", 16, 32, 2), "bn2", 32), "relu2")
    h = relu(conv(h, "conv3", 32, 32, 1), "relu3")
    nodes.append(helper.make_node("GlobalAveragePool", [h], ["pool"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], name="flatten", axis=1))
    w = add("fc.weight", _he(rng, (32, 10), 32))
    b = add("fc.bias", _small(rng, (10,)))
    nodes.append(helper.make_node("Gemm", ["flat", w, b], ["y"], name="fc"))
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, image_size, image_size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    return _model(graph)


def build_bottleneck(seed: int = 2) -> onnx.ModelProto:
    """ResNet's bottleneck on a [1, 64, 16, 16] input ``x``: a 1x1 convolution, ReLU, a 3x3 one (padding
    1), ReLU, a strided 1x1 one to 32 channels -> ``y`` [1, 32, 8, 8]; channels that are whole AMX blocks."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.standard_normal((64, 64, 1, 1)) / 8).astype(np.float32), "w1"),
        numpy_helper.from_array((rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32), "w2"),
        numpy_helper.from_array((rng.standard_normal((32, 64, 1, 1)) / 8).astype(np.float32), "w3"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="pointwise"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="window", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["y"], name="projection", strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "bottleneck",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 8, 8])],
        inits,
    )
    return _model(graph, 17)


def build_relu6_cnn(seed: int = 0, image_size: int = 16) -> onnx.ModelProto:
    """MobileNet-style block on input ``x`` [1, 3, H, W]: Conv 3->16 3x3 + Clip(0, 6), depthwise Conv
    16 3x3 + Clip(0, 6), Conv 16->32 1x1 -> output ``y`` [1, 32, H, W].

    ONNX ``Clip`` takes its bounds as inputs (opset >= 11), which TVM's importer turns into opaque
    maximum/minimum kernels.
    """
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(np.array(0.0, np.float32), "clip.min"),
        numpy_helper.from_array(np.array(6.0, np.float32), "clip.max"),
    ]
    nodes: list[onnx.NodeProto] = []

    def conv(x: str, name: str, c_in: int, c_out: int, kernel: int, groups: int = 1) -> str:
        inits.append(
            numpy_helper.from_array(
                _he(rng, (c_out, c_in // groups, kernel, kernel), c_in * kernel**2 // groups),
                f"{name}.weight",
            )
        )
        inits.append(numpy_helper.from_array(_small(rng, (c_out,)), f"{name}.bias"))
        pad = kernel // 2
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{name}.weight", f"{name}.bias"],
                [name],
                name=name,
                kernel_shape=[kernel, kernel],
                pads=[pad] * 4,
                group=groups,
            )
        )
        return name

    def relu6(x: str, name: str) -> str:
        nodes.append(helper.make_node("Clip", [x, "clip.min", "clip.max"], [name], name=name))
        return name

    h = relu6(conv("x", "conv1", 3, 16, 3), "relu6_1")
    h = relu6(conv(h, "dw", 16, 16, 3, groups=16), "relu6_2")
    conv(h, "y", 16, 32, 1)
    graph = helper.make_graph(
        nodes,
        "relu6_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, image_size, image_size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, image_size, image_size])],
        inits,
    )
    return _model(graph)


def build_encoder_block(
    seq: int = 32, hidden: int = 64, heads: int = 2, ffn: int = 256, seed: int = 0
) -> onnx.ModelProto:
    """A BERT-style encoder block (input ``x`` [1, seq, hidden]): one fused QKV projection, attention over
    ``heads`` heads, the output projection, LayerNorm, a GELU FFN, LayerNorm; exported by torch.onnx. Needs
    torch."""
    import math

    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(hidden, 3 * hidden)
            self.out = torch.nn.Linear(hidden, hidden)
            self.norm1 = torch.nn.LayerNorm(hidden)
            self.ffn = torch.nn.Sequential(
                torch.nn.Linear(hidden, ffn), torch.nn.GELU(), torch.nn.Linear(ffn, hidden)
            )
            self.norm2 = torch.nn.LayerNorm(hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            head = hidden // heads
            q, k, v = self.qkv(x).reshape(1, seq, 3, heads, head).permute(2, 0, 3, 1, 4)
            scores = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head), dim=-1)
            attended = (scores @ v).transpose(1, 2).reshape(1, seq, hidden)
            x = self.norm1(x + self.out(attended))
            return self.norm2(x + self.ffn(x))

    torch.manual_seed(seed)
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            Encoder().eval(),
            (torch.randn(1, seq, hidden),),
            buffer,
            input_names=["x"],
            output_names=["y"],
            dynamo=False,
            opset_version=17,
        )
    return onnx.load_from_string(buffer.getvalue())


def build_torch_relu6_cnn(seed: int = 0) -> torch.nn.Module:
    """The PyTorch twin of :func:`build_relu6_cnn`'s structure (ReLU6, then a Hardtanh(-1, 1) after the
    depthwise conv), in eval mode. Needs torch."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU6(),
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=16),
        torch.nn.Hardtanh(-1.0, 1.0),
        torch.nn.Conv2d(16, 32, 1),
    ).eval()


def build_torch_mlp(seed: int = 0) -> torch.nn.Module:
    """A small PyTorch MLP (Linear 16->32, ReLU, Linear 32->4) in eval mode. Needs torch."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()


def save_torch_program(
    module: torch.nn.Module,
    example: tuple[Any, ...],
    path: Path,
    dynamic_shapes: Any = None,
) -> Path:
    """Export ``module`` with ``torch.export.export`` and save it to ``path`` (a .pt2 file)."""
    import torch

    with torch.no_grad():
        program = torch.export.export(module, example, dynamic_shapes=dynamic_shapes)
    torch.export.save(program, path)
    return path


#: The values parameterized_onnx's parameter inputs are bound to in the tests.
PARAMETER_VALUES = {"shape": [6, -1], "axes": [1], "k": [2]}


def parameterized_onnx(path: Path) -> Path:
    """``x`` [2, 3, 4] reshaped by the input ``shape``, summed over the input ``axes``, its top ``k``
    (an input) taken: three operators whose parameters the graph takes at run time."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    axes = helper.make_tensor_value_info("axes", TensorProto.INT64, [1])
    k = helper.make_tensor_value_info("k", TensorProto.INT64, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("ReduceSum", ["r", "axes"], ["s"], keepdims=0),
        helper.make_node("TopK", ["s", "k"], ["y", "i"]),
    ]
    graph = helper.make_graph(nodes, "g", [x, shape, axes, k], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path
