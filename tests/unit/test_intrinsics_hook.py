"""Kiln's CPU tensor intrinsics are installed where TVM is loaded (``kiln_tvm``'s import hook), so that no
caller has to register them first: a ``TuneContext`` (which imports ``tvm.s_tir.tensor_intrin``) gets the
x86 ones and Kiln's, never TVM's CUDA ones, and a stored record whose trace tensorizes is read in a process
that registered nothing by hand. Each check runs in a fresh process, as a job's tuning process starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Kiln's VNNI and AVX512-BF16 dot products, and two of TVM's own x86 intrinsics (registering needs no such
#: CPU).
NAMES = ["kiln_dot_16x4_vnni", "kiln_dot_16x2_avx512bf16", "dot_16x4_vnni", "dot_16x4_avx512"]

_TUNE_CONTEXT = """
import json, sys
from kiln_tvm import ms
from tests.ms_workloads import matmul, target
from tvm.s_tir import TensorIntrin

names = json.loads(sys.argv[1])
def found():
    return {name: TensorIntrin.get(name, allow_missing=True) is not None for name in names}
before = found()
ms.TuneContext(mod=matmul(16), target=target(), task_name="t")
print(json.dumps({
    "before": before,
    "after": found(),
    "cuda": "tvm.s_tir.tensor_intrin.cuda" in sys.modules,
    "arm": "tvm.s_tir.tensor_intrin.arm_cpu" in sys.modules,
}))
"""

_READ_RECORD = """
import json, sys
from kiln_tvm import ms
from tuner.metaschedule.database import readable_record

stored = json.load(open(sys.argv[1]))
workload = ms.database.Workload.from_json(stored["workload"])
read = readable_record(json.dumps(stored["record"]), workload)
print(json.dumps({"read": read is not None}))
"""


def _tensorized_record(path: Path, intrinsic: str | None = None) -> Path:
    """A record of a VNNI-packed integer matmul whose trace tensorizes with Kiln's VNNI dot product (or,
    renamed, with ``intrinsic``), and its workload, as the store keeps them, in a JSON file."""
    from kiln_tvm import ms, tuning_record_json
    from schedules.vnni import vnni_lanes
    from tests.schedule_candidates import packed_vnni_matmul, sampled_candidates
    from tuner.targets import host_target, to_tvm_target

    host = to_tvm_target(host_target())
    vnni = (
        host
        if vnni_lanes(host) == 16
        else to_tvm_target({"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2})
    )
    mod = packed_vnni_matmul()
    (candidate,) = sampled_candidates(mod, vnni)
    workload = ms.database.Workload(mod)
    record = ms.database.TuningRecord(
        candidate.trace, workload, [1e-4], vnni, ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    )
    text = json.dumps(tuning_record_json(record))
    assert "kiln_dot_16x4_vnni" in text
    if intrinsic is not None:
        text = text.replace("kiln_dot_16x4_vnni", intrinsic)
    path.write_text(
        json.dumps({"record": json.loads(text), "workload": json.loads(json.dumps(workload.as_json()))})
    )
    return path


def _fresh_process(script: str, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_a_tune_context_gets_the_cpu_intrinsics_and_kiln_s_not_tvm_s_gpu_ones() -> None:
    result = _fresh_process(_TUNE_CONTEXT, json.dumps(NAMES))
    assert result["before"] == dict.fromkeys(NAMES, False)  # loading TVM registers nothing yet
    assert result["after"] == dict.fromkeys(NAMES, True)
    assert result["cuda"] is False and result["arm"] is False


@pytest.mark.slow
def test_a_stored_record_that_tensorizes_is_read_without_registering_by_hand(tmp_path: Path) -> None:
    """As a fresh tuning process reads its workloads' best records (the search, the compile, the cost
    model's catch-up), with nothing registered by hand: Kiln's intrinsic is registered on the way."""
    stored = _tensorized_record(tmp_path / "record.json")
    assert _fresh_process(_READ_RECORD, str(stored)) == {"read": True}


@pytest.mark.slow
def test_a_record_naming_an_intrinsic_no_kiln_has_is_still_left_out(tmp_path: Path) -> None:
    stored = _tensorized_record(tmp_path / "record.json", "kiln_from_a_newer_kiln")
    assert _fresh_process(_READ_RECORD, str(stored)) == {"read": False}
