"""ONNX's ``Attention`` (opsets 23-25) and ``RotaryEmbedding`` (opset 23) as Relax operators, as
``onnx.reference`` computes them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kiln_tvm import relax
from kiln_tvm.onnx_converters.tensors import constant, dtype_of, heads_first, static_shape


def attention(bb: Any, inputs: Any, attr: dict[str, Any]) -> Any:
    """ONNX ``Attention``'s four outputs (Y, present key, present value, the QK output of
    ``qk_matmul_output_mode``) for its inputs Q, K, V, mask, past key and value, ``nonpad_kv_seqlen``."""
    q, k, v = (bb.normalize(x) for x in inputs[:3])
    mask, past_key, past_value, nonpad = inputs[3], inputs[4], inputs[5], inputs[6]
    dtype = dtype_of(bb, q)
    three_d = len(static_shape(bb, q)) == 3
    if three_d:
        q_heads, kv_heads = int(attr["q_num_heads"]), int(attr["kv_num_heads"])
        q, k, v = heads_first(bb, q, q_heads), heads_first(bb, k, kv_heads), heads_first(bb, v, kv_heads)
    batch, q_heads, q_len, head_size = static_shape(bb, q)
    kv_heads = static_shape(bb, k)[1]

    scale = attr.get("scale")
    scale = math.sqrt(float(scale) if scale is not None else 1.0 / math.sqrt(head_size))
    if past_key is not None:
        k = bb.normalize(relax.op.concat([past_key, k], axis=2))
        v = bb.normalize(relax.op.concat([past_value, v], axis=2))
    present_key, present_value = k, v
    kv_len = static_shape(bb, k)[2]
    past_len = static_shape(bb, past_key)[2] if past_key is not None else 0

    neg_inf = relax.const(-np.inf, dtype)
    zero = relax.const(0.0, dtype)
    bias: Any = None  # additive, broadcast to [batch, heads, q_len, kv_len]
    if mask is not None:
        mask = bb.normalize(mask)
        width = static_shape(bb, mask)[-1]
        if dtype_of(bb, mask) == "bool":
            mask = relax.op.where(mask, zero, neg_inf)
        if width < kv_len:  # a mask shorter than the keys: the rest masked out
            pad = [(0, 0)] * (len(static_shape(bb, mask)) - 1) + [(0, kv_len - width)]
            mask = relax.op.nn.pad(mask, [p for pair in pad for p in pair], pad_value=-np.inf)
        bias = bb.normalize(mask)
    i = np.arange(q_len).reshape(q_len, 1)
    j = np.arange(kv_len).reshape(1, kv_len)
    if int(attr.get("is_causal", 0)):
        if nonpad is not None and past_key is None:  # the frontier of each batch entry's valid keys
            offset = relax.op.subtract(relax.op.astype(nonpad, "int64"), relax.const(q_len, "int64"))
            offset = relax.op.reshape(offset, (batch, 1, 1, 1))
            causal = relax.op.where(relax.op.less_equal(relax.const(j - i, "int64"), offset), zero, neg_inf)
        else:
            causal = constant(np.where(j <= i + past_len, 0.0, -np.inf).astype(dtype))
        bias = causal if bias is None else relax.op.add(bias, causal)
    left, right = int(attr.get("left_window_size", -1)), int(attr.get("right_window_size", -1))
    if (left >= 0 or right >= 0) and nonpad is not None and past_key is None:
        # an external cache: each batch entry's window ends at its own frontier, nonpad[b] - q_len
        offset = relax.op.subtract(relax.op.astype(nonpad, "int64"), relax.const(q_len, "int64"))
        distance = relax.op.add(relax.const(i - j, "int64"), relax.op.reshape(offset, (batch, 1, 1, 1)))
        bounds = []
        if left >= 0:
            bounds.append(relax.op.less_equal(distance, relax.const(left, "int64")))
        if right >= 0:
            bounds.append(relax.op.less_equal(relax.op.negative(distance), relax.const(right, "int64")))
        allowed_expr = bounds[0] if len(bounds) == 1 else relax.op.logical_and(bounds[0], bounds[1])
        window = relax.op.where(allowed_expr, zero, neg_inf)
        bias = window if bias is None else relax.op.add(bias, window)
    elif left >= 0 or right >= 0:
        diff = i + past_len - j
        allowed = np.ones_like(diff, dtype=bool)
        if left >= 0:
            allowed &= diff <= left
        if right >= 0:
            allowed &= -diff <= right
        window = constant(np.where(allowed, 0.0, -np.inf).astype(dtype))
        bias = window if bias is None else relax.op.add(bias, window)
    if nonpad is not None:
        valid = relax.op.less(
            relax.const(np.arange(kv_len).reshape(1, kv_len), "int64"),
            relax.op.reshape(relax.op.astype(nonpad, "int64"), (batch, 1)),
        )
        padding = relax.op.reshape(relax.op.where(valid, zero, neg_inf), (batch, 1, 1, kv_len))
        bias = padding if bias is None else relax.op.add(bias, padding)

    if q_heads != kv_heads:  # grouped-query attention: each key/value head serves q_heads / kv_heads
        k = relax.op.repeat(k, q_heads // kv_heads, axis=1)
        v = relax.op.repeat(v, q_heads // kv_heads, axis=1)
    scale_c = relax.const(scale, dtype)
    scores = bb.normalize(
        relax.op.matmul(
            relax.op.multiply(q, scale_c), relax.op.permute_dims(relax.op.multiply(k, scale_c), [0, 1, 3, 2])
        )
    )
    softcap = float(attr.get("softcap", 0.0))
    if softcap > 0:
        cap = relax.const(softcap, dtype)
        scores = bb.normalize(relax.op.multiply(relax.op.tanh(relax.op.divide(scores, cap)), cap))
    qk_output = scores
    with_bias = bb.normalize(relax.op.add(scores, bias)) if bias is not None else scores
    mode = int(attr.get("qk_matmul_output_mode", 0))
    if mode == 2:
        qk_output = with_bias
    precision = attr.get("softmax_precision")
    if precision is not None:
        from onnx import helper

        wide = str(np.dtype(helper.tensor_dtype_to_np_dtype(int(precision))))
        probs = relax.op.astype(relax.op.nn.softmax(relax.op.astype(with_bias, wide), axis=-1), dtype)
    else:
        probs = relax.op.nn.softmax(with_bias, axis=-1)
    if bias is not None:  # a row with no key to attend: probabilities 0 (softmax alone gives NaN)
        full_bias = bb.normalize(relax.op.add(relax.op.zeros((batch, q_heads, q_len, kv_len), dtype), bias))
        # every key -inf (TVM's max starts from the lowest finite value, so count rather than take the max)
        is_masked = relax.op.astype(relax.op.equal(full_bias, neg_inf), "int32")
        masked_row = relax.op.equal(
            relax.op.min(is_masked, axis=[-1], keepdims=True), relax.const(1, "int32")
        )
        probs = relax.op.where(masked_row, zero, probs)
    probs = bb.normalize(probs)
    if mode == 3:
        qk_output = probs
    y = bb.normalize(relax.op.matmul(probs, v))
    if three_d:
        y = relax.op.reshape(bb.normalize(relax.op.permute_dims(y, [0, 2, 1, 3])), (batch, q_len, -1))
    return relax.Tuple([bb.normalize(y), present_key, present_value, qk_output])


def rotary_embedding(bb: Any, inputs: Any, attr: dict[str, Any]) -> Any:
    """ONNX ``RotaryEmbedding`` of X (3-D with ``num_heads``, or 4-D) by the cached cosines and sines."""
    op = relax.op
    x, cos, sin, positions = (bb.normalize(v) if v is not None else None for v in inputs[:4])
    shape = static_shape(bb, x)
    if len(shape) == 4:  # [batch, heads, seq, head] -> [batch, seq, heads, head]
        x = bb.normalize(op.permute_dims(x, [0, 2, 1, 3]))
    else:
        heads = int(attr["num_heads"])
        x = bb.normalize(op.reshape(x, (shape[0], shape[1], heads, shape[2] // heads)))
    batch, seq, heads, head = static_shape(bb, x)
    dim = int(attr.get("rotary_embedding_dim", 0)) or head
    if positions is not None:  # caches [max_position, dim / 2] gathered to [batch, seq, dim / 2]
        cos, sin = op.take(cos, positions, axis=0), op.take(sin, positions, axis=0)
    cos = bb.normalize(op.expand_dims(cos, 2))
    sin = bb.normalize(op.expand_dims(sin, 2))
    rotate = bb.normalize(op.strided_slice(x, axes=[3], begin=[0], end=[dim]))
    if int(attr.get("interleaved", 0)):
        pairs = bb.normalize(op.reshape(rotate, (batch, seq, heads, dim // 2, 2)))
        x1 = bb.normalize(op.squeeze(op.strided_slice(pairs, axes=[4], begin=[0], end=[1]), [4]))
        x2 = bb.normalize(op.squeeze(op.strided_slice(pairs, axes=[4], begin=[1], end=[2]), [4]))
    else:
        x1 = bb.normalize(op.strided_slice(rotate, axes=[3], begin=[0], end=[dim // 2]))
        x2 = bb.normalize(op.strided_slice(rotate, axes=[3], begin=[dim // 2], end=[dim]))
    real = bb.normalize(op.subtract(op.multiply(cos, x1), op.multiply(sin, x2)))
    imag = bb.normalize(op.add(op.multiply(sin, x1), op.multiply(cos, x2)))
    if int(attr.get("interleaved", 0)):
        rotated = op.reshape(op.stack([real, imag], axis=4), (batch, seq, heads, dim))
    else:
        rotated = op.concat([real, imag], axis=3)
    rotated = bb.normalize(rotated)
    if dim < head:
        rotated = bb.normalize(
            op.concat([rotated, op.strided_slice(x, axes=[3], begin=[dim], end=[head])], axis=3)
        )
    if len(shape) == 4:
        return op.permute_dims(rotated, [0, 2, 1, 3])
    return op.reshape(rotated, shape)
