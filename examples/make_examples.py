"""Write the example ONNX models next to this file: ``mlp.onnx`` and ``small_cnn.onnx``.

Both are built with ``onnx.helper`` and seeded NumPy weights (opset 17, weights inline), so running this
again writes the same bytes. The builders live in ``tests/model_builders.py``, which the tests use too.

    python examples/make_examples.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository root, so that ``tests.model_builders`` imports

from tests.model_builders import build_mlp, build_small_cnn  # noqa: E402


def main() -> None:
    """Build both examples and save them beside this script."""
    for name, model in (("mlp", build_mlp()), ("small_cnn", build_small_cnn())):
        path = HERE / f"{name}.onnx"
        onnx.save(model, path)
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
