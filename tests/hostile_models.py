"""Model files an attacker or a clumsy user sends: pickles that run code, zip bombs, models that ask the
importer for gigabytes or for hours. Each is a real file of its format, built here (nothing downloaded).
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.model_builders import _model, build_torch_mlp, save_torch_program


class _RunsShell:
    """Unpickling this runs a shell command: what a hostile .pt2 member carries."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (self.command,))


def code_pickle(marker: Path) -> bytes:
    """Pickle bytes that create ``marker`` when unpickled."""
    import pickle

    return pickle.dumps(_RunsShell(f"touch {marker}"), protocol=2)


def _clean_pt2(path: Path) -> Path:
    import torch

    return save_torch_program(build_torch_mlp(), (torch.randn(2, 16),), path)


def pickle_pt2(dest: Path, route: str, marker: Path) -> Path:
    """A real torch.export program with one member replaced by a pickle that creates ``marker``.

    ``route`` ``"sample_inputs"`` replaces ``data/sample_inputs/model.pt`` (torch retries it with
    ``weights_only=False``); ``"use_pickle"`` marks the first weight ``"use_pickle": true`` in
    ``data/weights/model_weights_config.json`` and replaces its bytes (torch unpickles it unrestricted).
    """
    clean = dest.with_name(dest.stem + "-clean.pt2")
    _clean_pt2(clean)
    payload = code_pickle(marker)
    with zipfile.ZipFile(clean) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as out:
        config_name = next(n for n in src.namelist() if n.endswith("data/weights/model_weights_config.json"))
        config = json.loads(src.read(config_name))
        first_fqn = next(iter(config["config"]))
        weight_file = config["config"][first_fqn]["path_name"]
        for info in src.infolist():
            data = src.read(info)
            if route == "sample_inputs" and info.filename.endswith("data/sample_inputs/model.pt"):
                data = payload
            elif route == "use_pickle" and info.filename == config_name:
                config["config"][first_fqn]["use_pickle"] = True
                data = json.dumps(config).encode()
            elif route == "use_pickle" and info.filename.endswith(f"data/weights/{weight_file}"):
                data = payload
            out.writestr(info, data)
    clean.unlink()
    return dest


def zip_bomb_pt2(dest: Path, unpacked_mb: int) -> Path:
    """A real torch.export program plus one deflated member of ``unpacked_mb`` MiB of zeros (~1000:1)."""
    clean = dest.with_name(dest.stem + "-clean.pt2")
    _clean_pt2(clean)
    shutil.copyfile(clean, dest)
    clean.unlink()
    with zipfile.ZipFile(dest) as src:
        root = src.namelist()[0].split("/", 1)[0]
    chunk = bytes(1 << 20)
    with (
        zipfile.ZipFile(dest, "a", zipfile.ZIP_DEFLATED) as out,
        out.open(f"{root}/data/weights/weight_9999", "w", force_zip64=True) as member,
    ):
        for _ in range(unpacked_mb):
            member.write(chunk)
    return dest


def constant_bomb_onnx(rows: int = 16384, cols: int = 32768) -> onnx.ModelProto:
    """180 bytes that fold into a ``rows x cols`` float32 constant (2 GiB by default) during planning."""
    shape = numpy_helper.from_array(np.array([rows, cols], dtype=np.int64), "shape")
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["big"], value=one),
            helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
            helper.make_node("Add", ["x", "total"], ["y"]),
        ],
        "constant_bomb",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=[shape],
    )
    return _model(graph)


def long_chain_onnx(nodes: int = 50_000) -> onnx.ModelProto:
    """A valid model of ``nodes`` element-wise operators in a row: tiny, and slow to import and fuse."""
    ops = []
    previous = "x"
    for i in range(nodes):
        name = f"t{i}" if i < nodes - 1 else "y"
        ops.append(helper.make_node("Relu" if i % 2 else "Neg", [previous], [name]))
        previous = name
    graph = helper.make_graph(
        ops,
        "long_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
    )
    return _model(graph)


def nested_if_onnx(depth: int = 14) -> onnx.ModelProto:
    """``If`` nodes nested ``depth`` deep, each branch another ``If``: 2**depth of them in a small file,
    slow and memory-hungry to import and plan."""

    def branch(level: int, tag: str) -> onnx.GraphProto:
        out = f"y_{tag}"
        if level == 0:
            nodes = [helper.make_node("Neg" if tag.endswith("t") else "Relu", ["x"], [out])]
        else:
            nodes = [
                helper.make_node(
                    "If",
                    ["cond"],
                    [out],
                    then_branch=branch(level - 1, tag + "t"),
                    else_branch=branch(level - 1, tag + "e"),
                )
            ]
        return helper.make_graph(
            nodes, f"g_{tag}", [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 16])]
        )

    top = branch(depth, "r")
    graph = helper.make_graph(
        list(top.node),
        "nested_if",
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
        ],
        list(top.output),
    )
    return _model(graph)


def outer_product_onnx(n: int = 16384) -> onnx.ModelProto:
    """A column times a row: a model of ``n`` floats of weights whose one output is ``n x n`` (1 GiB at
    16384), so that every run, check and comparison of its outputs takes gigabytes."""
    row = numpy_helper.from_array(np.linspace(0.5, 1.5, n, dtype=np.float32).reshape(1, n), "row")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "row"], ["y"])],
        "outer_product",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
        initializer=[row],
    )
    return _model(graph)


def external_data_onnx(dest: Path, location: str) -> Path:
    """A small model whose one weight claims to live in the external file ``location``."""
    weight = numpy_helper.from_array(np.ones((4, 4), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[weight],
    )
    model = _model(graph)
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "64")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    dest.write_bytes(model.SerializeToString())
    return dest
