"""Graphs captured from a running program (``torch.compile(model, backend="kiln")``), compiled by Kiln.

TVM and PyTorch are imported on first use: registering the backend costs nothing.
"""

from tuner.capture.backend import compiled_graphs, kiln_backend

__all__ = ["compiled_graphs", "kiln_backend"]
