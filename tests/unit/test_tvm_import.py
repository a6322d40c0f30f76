"""Loading TVM through kiln_tvm: without PyTorch in processes that have not imported it (2.5 s each), with it
where a user's process has."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_tvm_loads_without_pytorch_which_still_imports_and_exchanges_tensors_after() -> None:
    out = _run(
        "import sys, kiln_tvm\n"
        "print('torch loaded with tvm:', 'torch' in sys.modules)\n"
        "import torch\n"
        "tensor = kiln_tvm.tvm.runtime.from_dlpack(torch.arange(4, dtype=torch.float32))\n"
        "print(tensor.numpy().tolist())\n"
    )
    assert out.splitlines() == ["torch loaded with tvm: False", "[0.0, 1.0, 2.0, 3.0]"]


def test_a_process_that_imported_pytorch_first_keeps_tvm_ffi_s_own_exchange_with_it() -> None:
    out = _run("import torch, kiln_tvm\nimport tvm_ffi._convert as convert\nprint(convert.torch is torch)\n")
    assert out.strip() == "True"
