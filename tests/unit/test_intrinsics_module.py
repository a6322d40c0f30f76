"""The kiln_intrinsics package an artifact ships: which of Kiln's intrinsics a record uses, and that plain
TVM, in a process that imports no Kiln module, gets them registered by importing it (AMX and AVX512-BF16
included: registering needs no such CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.intrinsics_module import PACKAGE, intrinsics_used, write_intrinsics_package

CHECK = """
import json, sys
sys.path.insert(0, sys.argv[1])
import kiln_intrinsics
from tvm.s_tir import TensorIntrin
names = json.loads(sys.argv[2])
found = {name: TensorIntrin.get(name, allow_missing=True) is not None for name in names}
kiln = sorted(m for m in sys.modules if m.split(".")[0] in ("tuner", "kiln_tvm", "schedules"))
print(json.dumps({"found": found, "used": kiln_intrinsics.USED, "kiln_modules": kiln}))
"""


def test_the_names_a_trace_uses_are_found() -> None:
    traces = [
        json.dumps([[["Annotate", ["b0"], ["meta_schedule.auto_tensorize", "kiln_dot_16x4_vnni"], []]], []]),
        '[["Tensorize", ["b1"], ["kiln_amx_u8s8s32_32x32x128", 1], []]]',
        '["dot_16x4_vnni", "kiln_not_an_intrinsic", "kiln_amx_zero_int32_16x32"]',
    ]
    assert intrinsics_used(traces) == {
        "kiln_dot_16x4_vnni",
        "kiln_amx_u8s8s32_32x32x128",
        "kiln_amx_zero_int32_16x32",
    }
    assert write_intrinsics_package(Path("/nonexistent"), set()) is None  # nothing used: nothing written


@pytest.mark.slow
def test_plain_tvm_registers_them_by_importing_the_package(tmp_path: Path) -> None:
    used = {"kiln_amx_u8s8s32_32x32x128", "kiln_dot_16x2_avx512bf16"}
    package = write_intrinsics_package(tmp_path, used)
    assert package == tmp_path / PACKAGE
    assert sorted(p.name for p in package.iterdir()) == ["__init__.py", "x86_amx.py", "x86_bf16.py"]
    names = [*sorted(used), "kiln_amx_zero_int32_16x32", "kiln_dot_16x4_vnni"]
    done = subprocess.run(
        [sys.executable, "-I", "-c", CHECK, str(tmp_path), json.dumps(names)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["kiln_modules"] == [] and result["used"] == sorted(used)
    # The modules of the intrinsics used, whole: AMX's zeroing too; VNNI's module was not shipped.
    assert result["found"] == {
        "kiln_amx_u8s8s32_32x32x128": True,
        "kiln_dot_16x2_avx512bf16": True,
        "kiln_amx_zero_int32_16x32": True,
        "kiln_dot_16x4_vnni": False,
    }
