"""A PyTorch ``torch.export`` program tuned end to end (needs the ``torch`` extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.host_jobs import run_host_job
from tests.model_builders import build_torch_mlp, save_torch_program
from tuner.compile import LoadedModel
from tuner.entities import JobStatus, ModelFormat
from tuner.settings import Settings
from tuner.store import Store

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def test_pt2_program_tunes_and_matches_torch_eager(settings: Settings, tmp_path: Path) -> None:
    module = build_torch_mlp()
    example = torch.randn(2, 16)
    path = save_torch_program(module, (example,), tmp_path / "mlp.pt2")
    store = Store.from_settings(settings)
    store.ensure_schema()

    result = run_host_job(store, settings, path, trials=4)
    assert store.get_model(result.job.spec.model_id).format is ModelFormat.TORCH_EXPORT

    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    assert [c.reference for c in result.comparisons] == ["untuned TVM"]
    import tarfile

    unpacked = tmp_path / "artifact"
    with tarfile.open(result.artifact.path) as tar:
        tar.extractall(unpacked, filter="data")
    from kiln_tvm import tvm

    loaded = LoadedModel(tvm.runtime.load_module(str(unpacked / "model.so")))
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(loaded.run([x])[0], expected, rtol=1e-4, atol=1e-5)
