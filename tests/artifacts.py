"""Helpers for tests that check a downloaded artifact: run it in a fresh process, compare with onnxruntime."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

LOAD_AND_RUN = """
import json, sys, os
os.environ.setdefault("TVM_NUM_THREADS", "2")
import numpy as np, tvm
from tvm import relax
root = sys.argv[1]
lib = tvm.runtime.load_module(os.path.join(root, "model.so"))
vm = relax.VirtualMachine(lib, tvm.cpu())
params = list(vm["main_transform_params"]([])) if vm.module.implements_function("main_transform_params") else []
x = np.load(os.path.join(root, "input.npy"))
out = vm["main"](tvm.runtime.tensor(x), *params)
np.save(os.path.join(root, "output.npy"), out.numpy())
"""


def onnxruntime_output(path: Path, x: np.ndarray) -> np.ndarray:
    """The reference output of a one-input ONNX model."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def run_artifact_in_fresh_process(artifact: Path, x: np.ndarray, workdir: Path) -> np.ndarray:
    """Unpack an artifact and run its model.so on ``x`` in a new Python process with plain TVM."""
    root = workdir / "unpacked"
    with tarfile.open(artifact, "r:gz") as tar:
        tar.extractall(root, filter="data")
    np.save(root / "input.npy", x)
    subprocess.run([sys.executable, "-c", LOAD_AND_RUN, str(root)], check=True, timeout=300)
    return np.load(root / "output.npy")


READ_RECORDS = """
import json, sys
root, register = sys.argv[1], sys.argv[2] == "register"
sys.path.insert(0, root)
if register:
    import kiln_intrinsics  # what the artifact ships: plain TVM only
from tvm.s_tir import meta_schedule as ms
db = ms.database.JSONDatabase(
    path_workload=root + "/records/database_workload.json",
    path_tuning_record=root + "/records/database_tuning_record.json",
)
records = db.get_all_tuning_records()
kiln = sorted(m for m in sys.modules if m.split(".")[0] in ("tuner", "kiln_tvm", "schedules", "cli", "service"))
print(json.dumps({"records": len(records), "traces": [str(r.trace) for r in records], "kiln_modules": kiln}))
"""


def read_records_in_fresh_process(
    artifact: Path, workdir: Path, register: bool
) -> subprocess.CompletedProcess:
    """Unpack an artifact and read its records with plain TVM's ``JSONDatabase`` in a new, isolated Python
    process (no Kiln module imported), after importing the artifact's ``kiln_intrinsics`` when ``register``."""
    root = workdir / "unpacked-records"
    if not root.exists():
        with tarfile.open(artifact, "r:gz") as tar:
            tar.extractall(root, filter="data")
    return subprocess.run(
        [sys.executable, "-I", "-c", READ_RECORDS, str(root), "register" if register else "plain"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )


#: The operators whose operands a reduced-precision job rounds (tuner.passes.precision's policy).
_REDUCED_OPERATORS = ("MatMul", "Gemm", "Conv")


def rounded_operands_output(path: Path, x: np.ndarray, dtype: int = onnx.TensorProto.BFLOAT16) -> np.ndarray:
    """onnxruntime's run of the one-input model at ``path`` with every matmul's, Gemm's and convolution's
    data and weight operands rounded to ``dtype`` (then computed in float32): what a job under the bf16 or
    fp16 policy computes, up to the order of its sums and its outputs' own rounding."""
    model = onnx.load(path)
    nodes = []
    for node in model.graph.node:
        if node.op_type in _REDUCED_OPERATORS:
            for index, name in enumerate(node.input[:2]):
                rounded = f"{name}__rounded_for_{node.name or id(node)}_{index}"
                nodes.append(helper.make_node("Cast", [name], [rounded + "_low"], to=dtype))
                nodes.append(
                    helper.make_node("Cast", [rounded + "_low"], [rounded], to=onnx.TensorProto.FLOAT)
                )
                node.input[index] = rounded
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]
