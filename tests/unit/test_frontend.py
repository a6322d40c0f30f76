"""Model import: formats, signatures, --input-shape parsing, typed errors, and numerical checks of the
imported Relax module against onnxruntime and torch eager."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.model_builders import build_mlp, build_small_cnn, build_torch_mlp, save_torch_program
from tuner.entities import ModelFormat, ModelSignature, TensorSpec
from tuner.errors import (
    InvalidModel,
    InvalidSpec,
    MissingDependency,
    MissingInputShape,
    UnsupportedOperator,
)
from tuner.frontend import (
    UNKNOWN_RANK,
    detect_format,
    load_model,
    parse_input_shapes,
    read_signature,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, path)
    return path


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: list[onnx.TensorProto] = (),  # type: ignore[assignment]
    opset: int = 17,
    extra_opsets: tuple[tuple[str, int], ...] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def fake_pt2(path: Path) -> Path:
    """A zip laid out like torch.export.save's archive (enough for format detection)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/archive_format", "pt2")
        archive.writestr("model/models/model.json", "{}")
    return path


def run_relax(mod: Any, inputs: list[np.ndarray]) -> np.ndarray:
    from kiln_tvm import Target, relax, tvm

    executable = tvm.compile(mod, target=Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


# --------------------------------------------------------------------------------------------------
# Format detection and unreadable files


def test_detect_format(tmp_path: Path) -> None:
    assert detect_format(EXAMPLES / "mlp.onnx") is ModelFormat.ONNX
    assert detect_format(fake_pt2(tmp_path / "m.pt2")) is ModelFormat.TORCH_EXPORT
    # a blob stored without an extension is recognised by its first bytes
    blob = tmp_path / "0123abcd"
    blob.write_bytes((EXAMPLES / "mlp.onnx").read_bytes())
    assert detect_format(blob) is ModelFormat.ONNX


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("model.tflite", b"TFL3\x00\x00garbage", "TensorFlow Lite"),
        ("model.bin", b"\x00\x01\x02garbage", "not a model format Kiln knows"),
        ("model.pt2", b"not a zip archive", "not a zip archive"),
    ],
)
def test_wrong_format(tmp_path: Path, name: str, content: bytes, expected: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InvalidModel, match=expected) as info:
        load_model(path)
    assert name in info.value.message


def test_torch_save_archive_is_explained(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("weights/data.pkl", b"\x80\x02}q\x00.")
    with pytest.raises(InvalidModel, match=r"torch\.save or torch\.jit\.save, not torch\.export\.save"):
        detect_format(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidModel, match="does not exist"):
        load_model(tmp_path / "nope.onnx")


def test_corrupt_bytes(tmp_path: Path) -> None:
    path = tmp_path / "x.onnx"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(InvalidModel, match=r"could not parse 'x\.onnx' as an ONNX model: .*corrupt"):
        load_model(path)
    with pytest.raises(InvalidModel, match="could not parse 'x.onnx'"):
        read_signature(path)


def test_truncated_file(tmp_path: Path) -> None:
    data = (EXAMPLES / "small_cnn.onnx").read_bytes()
    path = tmp_path / "half.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        InvalidModel, match=r"could not parse 'half\.onnx' as an ONNX model: the file is truncated"
    ):
        load_model(path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(InvalidModel, match=r"'empty\.onnx' is empty \(0 bytes\)"):
        load_model(path)


def test_protobuf_that_is_not_a_model(tmp_path: Path) -> None:
    # A valid protobuf (a TensorProto) that parses as a ModelProto without a graph.
    path = tmp_path / "tensor.onnx"
    path.write_bytes(numpy_helper.from_array(np.zeros(3, np.float32), "t").SerializeToString())
    with pytest.raises(InvalidModel, match="could not parse 'tensor.onnx' as an ONNX model"):
        load_model(path)


def test_invalid_graph(tmp_path: Path) -> None:
    model = make_model(
        [helper.make_node("Add", ["x", "undefined"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(InvalidModel, match=r"'bad\.onnx' is not a valid ONNX model: .*undefined"):
        load_model(save(model, tmp_path / "bad.onnx"))


# --------------------------------------------------------------------------------------------------
# Signatures and --input-shape


def test_read_signature_keeps_dynamic_dims(tmp_path: Path) -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", None, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None, 8])],
    )
    sig = read_signature(save(model, tmp_path / "dyn.onnx"))
    assert sig.inputs == (TensorSpec("x", ("batch", "dim1", 8), "float32"),)
    assert sig.outputs == (TensorSpec("y", ("batch", "dim1", 8), "float32"),)
    assert read_signature(EXAMPLES / "small_cnn.onnx") == ModelSignature(
        inputs=(TensorSpec("x", (1, 3, 32, 32), "float32"),),
        outputs=(TensorSpec("y", (1, 10), "float32"),),
    )


def test_read_signature_excludes_initializers_and_needs_no_tvm(tmp_path: Path) -> None:
    model = build_mlp()
    # old exporters list initializers among the graph inputs too
    model.graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in model.graph.initializer
    )
    path = save(model, tmp_path / "listed.onnx")
    code = (
        "import sys; from pathlib import Path; from tuner.frontend import read_signature; "
        f"s = read_signature(Path({str(path)!r})); "
        "print([i.name for i in s.inputs], 'tvm' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['x'] False"


def test_unknown_rank(tmp_path: Path) -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    path = save(model, tmp_path / "norank.onnx")
    assert read_signature(path).inputs[0].shape == UNKNOWN_RANK
    # the ONNX checker requires graph inputs to declare a shape (their rank)
    with pytest.raises(InvalidModel, match=r"'norank\.onnx' is not a valid ONNX model: .*'shape'"):
        load_model(path, {"x": (2, 3)})


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["x=1x3x224x224"], {"x": (1, 3, 224, 224)}),
        (["x=8x256", "mask=8"], {"x": (8, 256), "mask": (8,)}),
        ([" input:0 = 1,3, 32X32 "], {"input:0": (1, 3, 32, 32)}),
        (["a=b=2x2"], {"a=b": (2, 2)}),
        ([], {}),
    ],
)
def test_parse_input_shapes(items: list[str], expected: dict[str, tuple[int, ...]]) -> None:
    assert parse_input_shapes(items) == expected


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("1x3x224x224", "expected NAME=DIMS"),
        ("=1x3", "expected NAME=DIMS"),
        ("x=", "no dimensions after '='"),
        ("x=1xx3", "dimension '' is not a positive integer"),
        ("x=1x-3", "dimension '-3' is not a positive integer"),
        ("x=0x3", "dimension '0' is not a positive integer"),
        ("x=1x3.5", "dimension '3.5' is not a positive integer"),
    ],
)
def test_parse_input_shapes_rejects_bad_syntax(item: str, message: str) -> None:
    with pytest.raises(InvalidSpec, match=f"bad --input-shape '{item}'") as info:
        parse_input_shapes([item])
    assert message in info.value.message


def test_parse_input_shapes_rejects_duplicates() -> None:
    with pytest.raises(InvalidSpec, match="given twice for input 'x'"):
        parse_input_shapes(["x=1x2", "x=1x2"])


def test_dynamic_dim_without_shape(tmp_path: Path) -> None:
    path = save(build_mlp(batch="batch"), tmp_path / "dyn.onnx")
    with pytest.raises(MissingInputShape) as info:
        load_model(path)
    assert info.value.message == (
        "input 'x' has a dynamic dimension 0 ('batch'); give its shape, e.g. --input-shape x=1x256"
    )


def test_unknown_input_name(tmp_path: Path) -> None:
    path = save(build_mlp(batch="batch"), tmp_path / "dyn.onnx")
    with pytest.raises(
        InvalidSpec, match=r"--input-shape 'image' is not an input of the model; its inputs are: 'x'"
    ):
        load_model(path, {"image": (1, 256)})


def test_shape_rank_mismatch(tmp_path: Path) -> None:
    path = save(build_mlp(batch="batch"), tmp_path / "dyn.onnx")
    with pytest.raises(InvalidSpec, match=r"x=4x16x16 has 3 dimensions, but input 'x' has rank 2"):
        load_model(path, {"x": (4, 16, 16)})


def test_shape_static_dim_mismatch(tmp_path: Path) -> None:
    path = save(build_mlp(batch="batch"), tmp_path / "dyn.onnx")
    with pytest.raises(InvalidSpec, match=r"dimension 1 of input 'x' is fixed to 256 by the model, not 128"):
        load_model(path, {"x": (4, 128)})


def test_dynamic_batch_with_shape(tmp_path: Path) -> None:
    path = save(build_mlp(batch="batch"), tmp_path / "dyn.onnx")
    imported = load_model(path, {"x": (4, 256)})
    assert imported.signature == ModelSignature(
        inputs=(TensorSpec("x", (4, 256), "float32"),), outputs=(TensorSpec("y", (4, 10), "float32"),)
    )
    (param,) = imported.mod["main"].params
    assert [int(d) for d in param.ty.shape.values] == [4, 256]


def test_integer_inputs_keep_their_dtype(tmp_path: Path) -> None:
    # TVM's from_onnx types every input float32 unless told otherwise
    model = make_model(
        [helper.make_node("Add", ["ids", "ids"], ["y"])],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [3])],
    )
    imported = load_model(save(model, tmp_path / "ids.onnx"))
    assert imported.signature.inputs == (TensorSpec("ids", (3,), "int64"),)
    assert imported.signature.outputs == (TensorSpec("y", (3,), "int64"),)


# --------------------------------------------------------------------------------------------------
# Unsupported operators and converter failures


def test_unsupported_operators_are_all_listed(tmp_path: Path) -> None:
    """A custom op at the top level and QLinearConv (no TVM converter) inside an If branch."""
    qconv_inits = [
        numpy_helper.from_array(np.array(0.1, np.float32), "xs"),
        numpy_helper.from_array(np.array(0, np.uint8), "xz"),
        numpy_helper.from_array(np.ones((1, 1, 1, 1), np.uint8), "w"),
        numpy_helper.from_array(np.array(0.1, np.float32), "ws"),
        numpy_helper.from_array(np.array(0, np.uint8), "wz"),
        numpy_helper.from_array(np.array(0.1, np.float32), "ys"),
        numpy_helper.from_array(np.array(0, np.uint8), "yz"),
    ]
    then_branch = helper.make_graph(
        [helper.make_node("QLinearConv", ["q", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.UINT8, [1, 1, 4, 4])],
        qconv_inits,
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["q"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.UINT8, [1, 1, 4, 4])],
    )
    model = make_model(
        [
            helper.make_node("MyCustomOp", ["x"], ["c"], domain="com.example"),
            helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch),
        ],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4]),
            helper.make_tensor_value_info("q", TensorProto.UINT8, [1, 1, 4, 4]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 1, 4, 4]),
            helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 1, 4, 4]),
        ],
        extra_opsets=(("com.example", 1),),
    )
    with pytest.raises(UnsupportedOperator) as info:
        load_model(save(model, tmp_path / "custom.onnx"))
    assert info.value.operators == ["MyCustomOp", "QLinearConv"]
    assert info.value.message == (
        "operators 'MyCustomOp', 'QLinearConv' are not supported by the ONNX importer"
    )


def test_converter_failure_for_an_operator_form(tmp_path: Path) -> None:
    """Conv is supported, but not with four spatial dimensions: TVM raises NotImplementedError."""
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv4d")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 2, 2, 2])],
        [numpy_helper.from_array(np.ones((1, 1, 1, 1, 1, 1), np.float32), "w")],
    )
    with pytest.raises(UnsupportedOperator) as info:
        load_model(save(model, tmp_path / "conv4d.onnx"))
    assert info.value.operators == ["Conv"]
    assert info.value.message.startswith(
        "operator 'Conv' is not supported by the ONNX importer as node 'conv4d' uses it: Ndim > 5"
    )


def test_converter_failure_is_a_typed_error(tmp_path: Path) -> None:
    """An attribute value the checker lets through and the converter rejects (ValueError in TVM)."""
    model = make_model(
        [helper.make_node("Gelu", ["x"], ["y"], name="act", approximate="cubic")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        opset=20,
    )
    model.ir_version = 9
    with pytest.raises(InvalidModel) as info:
        load_model(save(model, tmp_path / "gelu.onnx"))
    assert info.value.message == (
        "the ONNX importer could not convert node 'act' (Gelu) of 'gelu.onnx': "
        "Unsupported approximate mode for Gelu: cubic"
    )


# --------------------------------------------------------------------------------------------------
# External data and canonical bytes


def test_inline_model_hashes_the_file(tmp_path: Path) -> None:
    import hashlib

    path = EXAMPLES / "small_cnn.onnx"
    imported = load_model(path)
    assert imported.canonical_bytes == path.read_bytes()
    assert imported.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert imported.format is ModelFormat.ONNX


def test_external_data_matches_inline(tmp_path: Path) -> None:
    model = build_mlp()
    inline = save(model, tmp_path / "inline.onnx")
    (tmp_path / "ext").mkdir()
    external = tmp_path / "ext" / "mlp.onnx"
    onnx.save(model, external, save_as_external_data=True, location="mlp.weights", size_threshold=0)
    assert external.stat().st_size < 1000  # the weights really are outside

    a, b = load_model(inline), load_model(external)
    assert b.sha256 == a.sha256
    assert b.canonical_bytes == inline.read_bytes()
    assert b.signature == a.signature
    assert read_signature(external) == read_signature(inline)

    (tmp_path / "ext" / "mlp.weights").unlink()
    with pytest.raises(InvalidModel, match=r"external data file 'mlp\.weights', which is not next to it"):
        load_model(external)


# --------------------------------------------------------------------------------------------------
# Numerical checks against onnxruntime


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "small_cnn"])
def test_examples_match_onnxruntime(name: str) -> None:
    import onnxruntime as ort

    path = EXAMPLES / f"{name}.onnx"
    imported = load_model(path)
    (spec,) = imported.signature.inputs
    x = np.random.default_rng(0).standard_normal(spec.shape).astype(np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    assert np.abs(expected).max() > 0.1  # the weights give a signal, not zeros
    got = run_relax(imported.mod, [x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_examples_are_reproducible() -> None:
    """examples/*.onnx are what tests/model_builders.py builds (run examples/make_examples.py after a change)."""
    assert (EXAMPLES / "mlp.onnx").read_bytes() == build_mlp().SerializeToString()
    assert (EXAMPLES / "small_cnn.onnx").read_bytes() == build_small_cnn().SerializeToString()


@pytest.mark.slow
def test_opset_11_matches_onnxruntime(tmp_path: Path) -> None:
    """Pre-13 operator forms (axes as attributes, Softmax's 2-D coercion) import correctly."""
    import onnxruntime as ort

    model = make_model(
        [
            helper.make_node("ReduceSum", ["x"], ["s"], axes=[3], keepdims=1),
            helper.make_node("Squeeze", ["s"], ["q"], axes=[3]),
            helper.make_node("Softmax", ["q"], ["y"], axis=1),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
        opset=11,
    )
    path = save(model, tmp_path / "opset11.onnx")
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32)
    (expected,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = run_relax(load_model(path).mod, [x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# torch.export programs


def test_bad_input_shape_values(tmp_path: Path) -> None:
    path = save(build_mlp(batch="batch"), tmp_path / "dyn.onnx")
    with pytest.raises(InvalidSpec, match="every dimension must be a positive integer"):
        load_model(path, {"x": (0, 256)})
    with pytest.raises(InvalidSpec, match="input shapes must map input names to tuples of integers"):
        load_model(path, {"x": ("four", 256)})  # type: ignore[dict-item]


def test_missing_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    path = fake_pt2(tmp_path / "m.pt2")
    expected = (
        r"loading \.pt2 programs needs PyTorch: pip install 'kiln-autotune\[torch\]' \(torch==2\.13\.0\)"
    )
    with pytest.raises(MissingDependency, match=expected):
        load_model(path)
    with pytest.raises(MissingDependency, match=expected):
        read_signature(path)


def test_truncated_pt2(tmp_path: Path, mlp_pt2: tuple[Any, Path]) -> None:
    _, whole = mlp_pt2
    path = tmp_path / "half.pt2"
    path.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(InvalidModel, match=r"could not read 'half\.pt2' as a torch\.export program"):
        load_model(path)


@pytest.mark.slow
def test_pt2_matches_torch(mlp_pt2: tuple[Any, Path]) -> None:
    import hashlib

    import torch

    model, path = mlp_pt2
    imported = load_model(path)
    assert imported.format is ModelFormat.TORCH_EXPORT
    assert imported.canonical_bytes == path.read_bytes()
    assert imported.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert imported.signature == ModelSignature(
        inputs=(TensorSpec("input", (3, 16), "float32"),),
        outputs=(TensorSpec("output", (3, 4), "float32"),),
    )
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(run_relax(imported.mod, [x]), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_pt2_dynamic_batch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = build_torch_mlp()
    batch = torch.export.Dim("batch", min=1, max=32)
    path = save_torch_program(
        model, (torch.randn(2, 16),), tmp_path / "dyn.pt2", dynamic_shapes={"input": {0: batch}}
    )
    declared = read_signature(path).inputs[0]
    assert isinstance(declared.shape[0], str) and declared.shape[1] == 16
    symbol = declared.shape[0]

    with pytest.raises(MissingInputShape) as info:
        load_model(path)
    assert info.value.message == (
        f"input 'input' has a dynamic dimension 0 ('{symbol}'); give its shape, "
        "e.g. --input-shape input=2x16"  # the sample input saved with the program
    )
    with pytest.raises(InvalidSpec, match=rf"dimension 0 of input 'input' \('{symbol}'\) must be in 1\.\.32"):
        load_model(path, {"input": (64, 16)})
    with pytest.raises(InvalidSpec, match="fixed to 16 by the model, not 8"):
        load_model(path, {"input": (4, 8)})

    imported = load_model(path, {"input": (5, 16)})
    assert imported.signature.inputs == (TensorSpec("input", (5, 16), "float32"),)
    assert imported.signature.outputs == (TensorSpec("output", (5, 4), "float32"),)
    assert "tir_var_upper_bound" not in imported.mod["main"].attrs
    x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(run_relax(imported.mod, [x]), expected, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def mlp_pt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """build_torch_mlp() exported for a batch of 3 (exporting takes seconds: once per module)."""
    torch = pytest.importorskip("torch")
    model = build_torch_mlp()
    path = tmp_path_factory.mktemp("pt2") / "mlp.pt2"
    return model, save_torch_program(model, (torch.randn(3, 16),), path)


@pytest.fixture(scope="module")
def custom_torch_op() -> Any:
    """A custom operator (torch.library) that no importer knows."""
    torch = pytest.importorskip("torch")

    # the schema is explicit because `from __future__ import annotations` hides the annotations' types
    @torch.library.custom_op("kiln_test::double", mutates_args=(), schema="(Tensor x) -> Tensor")
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @double.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    return double


def test_pt2_unsupported_operators_are_all_listed(tmp_path: Path, custom_torch_op: Any) -> None:
    import torch

    class Odd(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.erfinv(custom_torch_op(x).clamp(-0.5, 0.5))
            return torch.cummax(y, dim=1).values

    path = save_torch_program(Odd(), (torch.randn(2, 4),), tmp_path / "odd.pt2")
    with pytest.raises(UnsupportedOperator) as info:
        load_model(path)
    assert info.value.operators == ["aten.cummax.default", "aten.erfinv.default", "kiln_test.double.default"]
    assert info.value.message == (
        "operators 'aten.cummax.default', 'aten.erfinv.default', 'kiln_test.double.default' "
        "are not supported by the PyTorch importer"
    )
