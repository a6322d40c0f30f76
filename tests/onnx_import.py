"""An ONNX file run as Kiln imports it (an untuned build of the imported module), for the tests that
compare it with onnxruntime or ONNX's reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tuner.compile import LoadedModel, build_untuned
from tuner.frontend import load_model
from tuner.targets import host_target, to_tvm_target


def untuned_outputs(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Import ``path`` with the shapes of ``feeds``, build it untuned for this CPU and run it on them."""
    imported = load_model(path, {name: value.shape for name, value in feeds.items()})
    executable = build_untuned(imported.mod, to_tvm_target(host_target()))
    return LoadedModel(executable).run(list(feeds.values()))


def assert_outputs_match(got: list[np.ndarray], expected: list[np.ndarray], rtol: float, atol: float) -> None:
    """As many outputs as expected, each of the expected shape and within the tolerances."""
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
