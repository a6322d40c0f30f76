"""Importing and planning a large model takes memory in proportion to its weights: at most
``PLANNING_MEMORY_RATIO`` times them (the figure the refusal of a model that does not fit quotes), measured
as the growth of the process's data segment (what the import limit, ``RLIMIT_DATA``, counts) in a fresh
process that has TVM and onnxruntime loaded, as a worker has."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tuner.isolation.sandbox import PLANNING_MEMORY_RATIO, SandboxLimits

pytestmark = pytest.mark.slow

WIDTH, LAYERS = 2048, 10  # 10 x 16 MiB of fp32 weights

MEASURE = """
import json, sys, threading, time
from pathlib import Path
from tuner.frontend import load_model, warm_up
from tuner.isolation.sandbox import data_segment_bytes
from tuner.targets import host_target, to_tvm_target
from tuner.passes.plan import plan_graph
import onnxruntime

warm_up()
target = to_tvm_target(host_target())
base = data_segment_bytes()
peak = [base]
done = threading.Event()

def watch():
    while not done.is_set():
        peak[0] = max(peak[0], data_segment_bytes())
        time.sleep(0.002)

watcher = threading.Thread(target=watch, daemon=True)
watcher.start()
imported = load_model(Path(sys.argv[1]), {"x": (4, int(sys.argv[2]))})
plan = plan_graph(imported.mod, target)
done.set()
watcher.join()
peak[0] = max(peak[0], data_segment_bytes())
print(json.dumps({"growth": peak[0] - base, "tasks": len(plan.tasks)}))
"""


def _large_model(path: Path) -> int:
    """An MLP of LAYERS 2048x2048 matmuls whose output is reshaped by a Shape subgraph (folded before
    conversion); returns its weights' bytes."""
    rng = np.random.default_rng(0)
    inits, nodes, x = [], [], "x"
    for i in range(LAYERS):
        inits.append(
            numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) * 0.02).astype(np.float32), f"w{i}")
        )
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"]),
        ]
        x = f"r{i}"
    nodes += [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Reshape", [x, "shape"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "large",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return sum(t.ByteSize() for t in inits)


def test_planning_memory_is_in_proportion_to_the_weights(tmp_path: Path) -> None:
    path = tmp_path / "large.onnx"
    weights = _large_model(path)
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), str(WIDTH)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tasks"] >= 1
    ratio = result["growth"] / weights
    assert ratio <= PLANNING_MEMORY_RATIO, (
        f"planning took {ratio:.2f}x the weights ({result['growth'] >> 20} MiB)"
    )


def test_a_model_that_does_not_fit_is_told_what_it_needs() -> None:
    limits = SandboxLimits(memory_mb=512, cpu_s=60, timeout_s=60)
    message = limits.too_much_memory(400 << 20).message
    assert message == (
        "model too large to import within 512 MiB of memory (KILN_IMPORT_MEMORY_MB): its 400 MiB of weights "
        f"need about {PLANNING_MEMORY_RATIO:g} times that to import and plan; set KILN_IMPORT_MEMORY_MB to 1280 "
        "or more"
    )
    # A small file that unfolds into gigabytes is not explained by its size: no figure is made up.
    assert limits.too_much_memory(1 << 20).message == (
        "model too large to import within 512 MiB of memory (KILN_IMPORT_MEMORY_MB)"
    )
