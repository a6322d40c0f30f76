"""PyTorch eager twins of the bundled example models, filled with the weights of their ONNX files.

The modules are written the way a PyTorch user would write these architectures (``nn.Conv2d``,
``nn.BatchNorm2d`` in eval mode, ``nn.Linear``); see ``tests/model_builders.py`` for the ONNX builders. ONNX
``Gemm`` keeps its weight as [in, out] while ``nn.Linear`` wants [out, in], hence the transposes.
Loading is strict: every ONNX initializer must fill exactly one parameter or buffer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn


class MLP(nn.Module):
    """``mlp``: Linear 256->512, ReLU, Linear 512->10."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(256, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class SmallCNN(nn.Module):
    """``small_cnn``: three 3x3 convs (BN after the first two), global average pool, Linear 32->10."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16, eps=1e-5)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(32, eps=1e-5)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        x = torch.relu(self.conv3(x))
        return self.fc(torch.flatten(torch.mean(x, dim=(2, 3), keepdim=True), 1))


# ONNX initializer name suffix -> (torch state-dict suffix, transpose?)
_RENAMES = {
    "mlp": {"weight": ("weight", True), "bias": ("bias", False)},
    "small_cnn": {
        "weight": ("weight", False),  # convs; fc.weight is transposed below
        "bias": ("bias", False),
        "scale": ("weight", False),
        "mean": ("running_mean", False),
        "var": ("running_var", False),
    },
}
_MODULES: dict[str, type[nn.Module]] = {"mlp": MLP, "small_cnn": SmallCNN}


def from_onnx(path: Path) -> nn.Module:
    """The eager module for the ONNX graph named ``mlp`` or ``small_cnn``, in eval mode with its weights."""
    model = onnx.load(str(path))
    name = model.graph.name
    if name not in _MODULES:
        raise ValueError(f"no PyTorch twin for ONNX graph {name!r}; known: {', '.join(_MODULES)}")
    module = _MODULES[name]()
    state: dict[str, torch.Tensor] = {}
    for init in model.graph.initializer:
        layer, _, kind = init.name.rpartition(".")
        key, transpose = _RENAMES[name][kind]
        array = numpy_helper.to_array(init)
        if transpose or (layer == "fc" and kind == "weight"):
            array = array.T
        state[f"{layer}.{key}"] = torch.tensor(np.ascontiguousarray(array))
    for key, value in module.state_dict().items():
        if key.endswith("num_batches_tracked"):
            state[key] = value
    module.load_state_dict(state, strict=True)
    return module.eval()
