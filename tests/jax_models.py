"""JAX programs the tests and benchmarks export: an MLP, a small CNN and a transformer block, their weights
closed over (constants of the exported program). Needs the ``jax`` extra."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

JaxProgram = tuple[
    Callable[..., Any], tuple[tuple[int, ...], str], Callable[[np.random.Generator], np.ndarray]
]


def _weights(seed: int, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal(s) / np.sqrt(max(1, int(np.prod(s[:-1]))))).astype(np.float32) for s in shapes
    ]


def jax_mlp(batch: int = 4, width: int = 64, seed: int = 0) -> JaxProgram:
    """x[batch, width] -> softmax(relu(x W1 + b1) W2 + b2), and the hidden layer's sum."""
    import jax
    import jax.numpy as jnp

    w1, b1, w2, b2 = (jnp.asarray(w) for w in _weights(seed, (width, 128), (128,), (128, 10), (10,)))

    def mlp(x: Any) -> Any:
        hidden = jax.nn.relu(x @ w1 + b1)
        return jax.nn.softmax(hidden @ w2 + b2, axis=-1), hidden.sum()

    return (
        mlp,
        ((batch, width), "float32"),
        lambda rng: rng.standard_normal((batch, width)).astype(np.float32),
    )


def jax_cnn(size: int = 32, seed: int = 0) -> JaxProgram:
    """NHWC image -> conv 3x3, ReLU, max-pool 2x2, strided conv, depthwise conv, sum-pool, global mean, dense."""
    import jax
    import jax.numpy as jnp

    k1, k2, k3, dense = (
        jnp.asarray(w) for w in _weights(seed, (3, 3, 3, 16), (3, 3, 16, 32), (3, 3, 1, 32), (32, 10))
    )
    nhwc = ("NHWC", "HWIO", "NHWC")

    def cnn(x: Any) -> Any:
        y = jax.nn.relu(jax.lax.conv_general_dilated(x, k1, (1, 1), "SAME", dimension_numbers=nhwc))
        y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        y = jax.nn.relu(jax.lax.conv_general_dilated(y, k2, (2, 2), ((1, 1), (1, 1)), dimension_numbers=nhwc))
        y = jax.lax.conv_general_dilated(
            y, k3, (1, 1), "SAME", dimension_numbers=nhwc, feature_group_count=32
        )
        y = jax.lax.reduce_window(y, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "SAME")
        return jnp.tanh(y.mean(axis=(1, 2)) @ dense)

    return (
        cnn,
        ((1, size, size, 3), "float32"),
        lambda rng: rng.standard_normal((1, size, size, 3)).astype(np.float32),
    )


def jax_transformer_block(
    batch: int = 2, seq: int = 16, dim: int = 64, vocab: int = 100, seed: int = 0
) -> JaxProgram:
    """Token ids -> embedding (gather), layer norm, causal single-head attention, GELU MLP, residuals."""
    import jax
    import jax.numpy as jnp

    emb, wq, wk, wv, wo, w1, w2, gamma = (
        jnp.asarray(w)
        for w in _weights(
            seed,
            (vocab, dim),
            (dim, dim),
            (dim, dim),
            (dim, dim),
            (dim, dim),
            (dim, 4 * dim),
            (4 * dim, dim),
            (dim,),
        )
    )

    def norm(x: Any) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * (1.0 + gamma)

    def block(ids: Any) -> Any:
        x = emb[ids]
        h = norm(x)
        q, k, v = h @ wq, h @ wk, h @ wv
        scores = jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(dim)
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        attn = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        x = x + jnp.einsum("bqk,bkd->bqd", attn, v) @ wo
        return x + jax.nn.gelu(norm(x) @ w1) @ w2

    return block, ((batch, seq), "int32"), lambda rng: rng.integers(0, vocab, (batch, seq)).astype(np.int32)


def export_jax(program: JaxProgram, path: Path) -> Path:
    """``jax.export`` the program for its input shape: ``.jax`` (serialized) or ``.mlir`` (StableHLO text)."""
    import jax
    from jax import export

    fn, (shape, dtype), _ = program
    exported = export.export(jax.jit(fn))(jax.ShapeDtypeStruct(shape, dtype))
    if path.suffix == ".jax":
        path.write_bytes(bytes(exported.serialize()))
    else:
        path.write_text(exported.mlir_module())
    return path


def jax_outputs(program: JaxProgram, x: np.ndarray) -> list[np.ndarray]:
    """What ``jax.jit`` of the program returns for ``x``, flattened."""
    import jax

    out = jax.jit(program[0])(x)
    return [np.asarray(o) for o in jax.tree_util.tree_leaves(out)]
