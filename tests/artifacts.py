"""Helpers for tests that check a downloaded artifact: run it in a fresh process, compare with onnxruntime."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

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
    ort = pytest.importorskip("onnxruntime")
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
