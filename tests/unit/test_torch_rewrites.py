"""ATen semantics TVM's PyTorch importer does not model, rewritten in the program before it converts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.model_builders import save_torch_program
from tuner.compile import LoadedModel, build_untuned
from tuner.frontend import load_model
from tuner.targets import host_target, to_tvm_target

torch = pytest.importorskip("torch")


class _EmptyCache(torch.nn.Module):
    """Keys appended to an empty cache as transformers' ``DynamicCache`` does on a first call:
    ``cat([torch.tensor([]), keys], dim=-2)``, which PyTorch allows whatever the keys' rank; then a
    three-way cat with an empty operand in the middle."""

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        empty = torch.tensor([], dtype=keys.dtype)
        cached = torch.cat([empty, keys], dim=-2)
        return torch.cat([cached, empty, keys * 2.0], dim=-1)


def test_a_cat_with_an_empty_1d_operand_imports_as_pytorch_computes_it(tmp_path: Path) -> None:
    keys = torch.randn(1, 2, 3, 4)
    path = save_torch_program(_EmptyCache(), (keys,), tmp_path / "cache.pt2")
    imported = load_model(path)
    got = LoadedModel(build_untuned(imported.mod, to_tvm_target(host_target()))).run([keys.numpy()])
    with torch.no_grad():
        expected = _EmptyCache()(keys).numpy()
    assert got[0].shape == expected.shape == (1, 2, 3, 8)
    np.testing.assert_allclose(got[0], expected, rtol=1e-6, atol=1e-6)
