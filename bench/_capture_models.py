"""The three models of ``bench/capture.py``, written as a PyTorch user and a JAX user would write them,
with the same weights (seeded), so that every implementation computes the same function.

* ``mlp``: x[16, 512] -> Linear 1024, ReLU -> Linear 1024, ReLU -> Linear 10.
* ``cnn``: x[1, 3, 64, 64] (NCHW) -> conv 3x3 32, ReLU, max-pool 2 -> conv 3x3 64, ReLU -> conv 3x3/2 64,
  ReLU -> global mean -> Linear 10.
* ``transformer``: x[1, 128, 256] -> pre-norm block: LayerNorm, 4-head causal self-attention, residual,
  LayerNorm, MLP 256 -> 1024 (GELU, tanh form) -> 256, residual.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

MODELS = ("mlp", "cnn", "transformer")
HEADS = 4


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(512, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 64, 3, stride=2, padding=1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.relu(self.conv3(torch.relu(self.conv2(x))))
        return self.fc(x.mean(dim=(2, 3)))


class Block(nn.Module):
    def __init__(self, dim: int = 256) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, HEADS, d // HEADS).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // HEADS)
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        attn = torch.softmax(scores.masked_fill(~causal, -1e9), dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x)), approximate="tanh"))


_BUILDERS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlp": (MLP, (16, 512)),
    "cnn": (CNN, (1, 3, 64, 64)),
    "transformer": (Block, (1, 128, 256)),
}


def torch_model(name: str) -> nn.Module:
    """The model, its weights seeded, in eval mode."""
    torch.manual_seed(0)
    return _BUILDERS[name][0]().eval()


def example_input(name: str) -> np.ndarray:
    return np.random.default_rng(1).standard_normal(_BUILDERS[name][1]).astype(np.float32)


def jax_function(name: str) -> Callable[[Any], Any]:
    """The same model written with ``jax.numpy`` / ``jax.lax``, over the PyTorch model's weights."""
    import jax
    import jax.numpy as jnp

    w = {k: jnp.asarray(v.detach().numpy()) for k, v in torch_model(name).state_dict().items()}

    def linear(x: Any, prefix: str) -> Any:
        return x @ w[f"{prefix}.weight"].T + w[f"{prefix}.bias"]

    def conv(x: Any, prefix: str, stride: int) -> Any:
        y = jax.lax.conv_general_dilated(
            x,
            w[f"{prefix}.weight"],
            (stride, stride),
            ((1, 1), (1, 1)),
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
        )
        return y + w[f"{prefix}.bias"][None, :, None, None]

    def layer_norm(x: Any, prefix: str) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * w[f"{prefix}.weight"] + w[f"{prefix}.bias"]

    def mlp(x: Any) -> Any:
        return linear(jax.nn.relu(linear(jax.nn.relu(linear(x, "fc1")), "fc2")), "fc3")

    def cnn(x: Any) -> Any:
        x = jax.nn.relu(conv(x, "conv1", 1))
        x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        x = jax.nn.relu(conv(jax.nn.relu(conv(x, "conv2", 1)), "conv3", 2))
        return linear(x.mean(axis=(2, 3)), "fc")

    def block(x: Any) -> Any:
        b, s, d = x.shape
        q, k, v = jnp.split(linear(layer_norm(x, "ln1"), "qkv"), 3, axis=-1)
        q, k, v = (t.reshape(b, s, HEADS, d // HEADS).transpose(0, 2, 1, 3) for t in (q, k, v))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // HEADS)
        causal = jnp.tril(jnp.ones((s, s), dtype=bool))
        attn = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        x = x + linear((attn @ v).transpose(0, 2, 1, 3).reshape(b, s, d), "proj")
        return x + linear(jax.nn.gelu(linear(layer_norm(x, "ln2"), "up"), approximate=True), "down")

    return {"mlp": mlp, "cnn": cnn, "transformer": block}[name]
