"""ONNX's ``LSTM``, ``GRU`` and ``RNN`` unrolled over a static sequence."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln_tvm import relax
from kiln_tvm.onnx_converters.tensors import constant, dtype_of, static_shape

#: Gates per cell, and the default activations of one direction (ONNX's operator definitions).
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
#: Activations that take alpha (and beta), with ONNX's defaults for them.
_ACTIVATION_PARAMS = {
    "Affine": (1.0, 0.0),
    "LeakyRelu": (0.01, None),
    "ThresholdedRelu": (1.0, None),
    "ScaledTanh": (1.0, 1.0),
    "HardSigmoid": (0.2, 0.5),
    "Elu": (1.0, None),
}


def _activation(name: str, alpha: float | None, beta: float | None, dtype: str) -> Any:
    """ONNX's recurrent activation ``name`` as a function of a Relax expression."""

    def c(value: float) -> Any:
        return relax.const(value, dtype)

    def f(x: Any) -> Any:
        op = relax.op
        if name == "Sigmoid":
            return op.sigmoid(x)
        if name == "Tanh":
            return op.tanh(x)
        if name == "Relu":
            return op.nn.relu(x)
        if name == "Affine":
            return op.add(op.multiply(c(alpha), x), c(beta))
        if name == "LeakyRelu":
            return op.where(op.less(x, c(0.0)), op.multiply(c(alpha), x), x)
        if name == "ThresholdedRelu":
            return op.where(op.greater(x, c(alpha)), x, c(0.0))
        if name == "ScaledTanh":
            return op.multiply(c(alpha), op.tanh(op.multiply(c(beta), x)))
        if name == "HardSigmoid":
            return op.clip(op.add(op.multiply(c(alpha), x), c(beta)), 0.0, 1.0)
        if name == "Elu":
            return op.where(op.less(x, c(0.0)), op.multiply(c(alpha), op.subtract(op.exp(x), c(1.0))), x)
        if name == "Softsign":
            return op.divide(x, op.add(op.abs(x), c(1.0)))
        if name == "Softplus":
            return op.log(op.add(op.exp(x), c(1.0)))
        raise ValueError(f"activation {name!r} of a recurrent operator")

    return f


def recurrent(bb: Any, kind: str, inputs: Any, attr: dict[str, Any]) -> Any:
    """``LSTM``, ``GRU`` or ``RNN`` as ONNX defines them, unrolled over the (static) sequence: the input
    projections of every step in one matmul per direction, then per step the recurrent matmul and the
    gates. Outputs ``Y`` [seq, directions, batch, hidden], ``Y_h`` (and ``Y_c``), in ``layout`` 0 or 1.
    ``sequence_lens`` given at run time is honoured for the forward direction (a step past an entry's length
    keeps its state and outputs zeros); for the reverse one it is refused."""
    op = relax.op
    x, w, r, b, lens = (bb.normalize(v) if v is not None else None for v in inputs[:5])
    h0 = inputs[5]
    c0, peep = (inputs[6], inputs[7]) if kind == "LSTM" else (None, None)
    batch_first = int(attr.get("layout", 0)) == 1
    if batch_first:
        x = bb.normalize(op.permute_dims(x, [1, 0, 2]))
        h0 = bb.normalize(op.permute_dims(h0, [1, 0, 2])) if h0 is not None else None
        c0 = bb.normalize(op.permute_dims(c0, [1, 0, 2])) if c0 is not None else None
    seq, batch, _ = static_shape(bb, x)
    dtype = dtype_of(bb, x)
    gates = _GATES[kind]
    direction = attr.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    hidden = int(attr.get("hidden_size") or static_shape(bb, w)[1] // gates)
    names = [a.decode() if isinstance(a, bytes) else str(a) for a in attr.get("activations", ())]
    names = names or list(_DEFAULT_ACTIVATIONS[kind]) * len(directions)
    alphas, betas = list(attr.get("activation_alpha", ())), list(attr.get("activation_beta", ()))
    acts = []
    for name in names:
        alpha, beta = _ACTIVATION_PARAMS.get(name, (None, None))
        if name in _ACTIVATION_PARAMS:
            alpha = float(alphas.pop(0)) if alphas else alpha
            if beta is not None:
                beta = float(betas.pop(0)) if betas else beta
        acts.append(_activation(name, alpha, beta, dtype))
    per_direction = len(_DEFAULT_ACTIVATIONS[kind])
    clip = attr.get("clip")
    linear_before_reset = int(attr.get("linear_before_reset", 0))
    if lens is not None and "reverse" in directions:
        raise ValueError(f"{kind} in reverse with sequence_lens given at run time")
    lens64 = bb.normalize(op.reshape(op.astype(lens, "int64"), (batch, 1))) if lens is not None else None

    def part(expr: Any, index: int, count: int = hidden, axis: int = 1) -> Any:
        return bb.normalize(
            op.strided_slice(expr, axes=[axis], begin=[index * count], end=[(index + 1) * count])
        )

    def pre(expr: Any) -> Any:  # the clip ONNX applies to an activation's input
        return op.clip(expr, -float(clip), float(clip)) if clip is not None else expr

    ys, last_h, last_c = [], [], []
    for d, way in enumerate(directions):
        f, g, h_act = (acts[d * per_direction + i] if i < per_direction else None for i in range(3))
        w_t = bb.normalize(op.permute_dims(op.take(w, relax.const(d, "int64"), axis=0), [1, 0]))  # [in, G*h]
        r_d = bb.normalize(op.take(r, relax.const(d, "int64"), axis=0))  # [G*h, h]
        b_d = bb.normalize(op.take(b, relax.const(d, "int64"), axis=0)) if b is not None else None
        w_bias = part(b_d, 0, gates * hidden, 0) if b_d is not None else None
        r_bias = part(b_d, 1, gates * hidden, 0) if b_d is not None else None
        projected = bb.normalize(op.matmul(x, w_t))  # [seq, batch, G*h]
        if w_bias is not None:
            projected = bb.normalize(op.add(projected, w_bias))
        zeros = constant(np.zeros((batch, hidden), dtype=dtype))
        h = bb.normalize(op.take(h0, relax.const(d, "int64"), axis=0)) if h0 is not None else zeros
        c = bb.normalize(op.take(c0, relax.const(d, "int64"), axis=0)) if c0 is not None else zeros
        p_d = bb.normalize(op.take(peep, relax.const(d, "int64"), axis=0)) if peep is not None else None
        out: list[Any] = [None] * seq
        for t in range(seq) if way == "forward" else reversed(range(seq)):
            x_t = bb.normalize(op.squeeze(op.strided_slice(projected, axes=[0], begin=[t], end=[t + 1]), [0]))
            if kind == "GRU":
                z_r = bb.normalize(
                    op.add(
                        part(x_t, 0, 2 * hidden),
                        op.matmul(h, op.permute_dims(part(r_d, 0, 2 * hidden, 0), [1, 0])),
                    )
                )
                if r_bias is not None:
                    z_r = bb.normalize(op.add(z_r, part(r_bias, 0, 2 * hidden, 0)))
                z, reset = f(pre(part(z_r, 0))), f(pre(part(z_r, 1)))
                r_h = op.permute_dims(part(r_d, 2, hidden, 0), [1, 0])
                rb_h = part(r_bias, 2, hidden, 0) if r_bias is not None else None
                if linear_before_reset:
                    recur = op.matmul(h, r_h)
                    recur = op.add(recur, rb_h) if rb_h is not None else recur
                    cand_in = op.add(part(x_t, 2), op.multiply(reset, recur))
                else:
                    cand_in = op.add(part(x_t, 2), op.matmul(op.multiply(reset, h), r_h))
                    cand_in = op.add(cand_in, rb_h) if rb_h is not None else cand_in
                cand = g(pre(cand_in))
                new_h = bb.normalize(
                    op.add(op.multiply(op.subtract(relax.const(1.0, dtype), z), cand), op.multiply(z, h))
                )
                new_c = c
            else:
                all_gates = op.add(x_t, op.matmul(h, op.permute_dims(r_d, [1, 0])))
                all_gates = bb.normalize(op.add(all_gates, r_bias) if r_bias is not None else all_gates)
                if kind == "RNN":
                    new_h, new_c = bb.normalize(f(pre(all_gates))), c
                else:  # gates in ONNX's order i, o, f, c; peepholes i, o, f
                    i_in, o_in, f_in, c_in = (part(all_gates, k) for k in range(4))
                    if p_d is not None:
                        i_in = op.add(i_in, op.multiply(part(p_d, 0, hidden, 0), c))
                        f_in = op.add(f_in, op.multiply(part(p_d, 2, hidden, 0), c))
                    if int(attr.get("input_forget", 0)):
                        forget = op.subtract(relax.const(1.0, dtype), f(pre(i_in)))
                    else:
                        forget = f(pre(f_in))
                    new_c = bb.normalize(
                        op.add(op.multiply(forget, c), op.multiply(f(pre(i_in)), g(pre(c_in))))
                    )
                    if p_d is not None:
                        o_in = op.add(o_in, op.multiply(part(p_d, 1, hidden, 0), new_c))
                    new_h = bb.normalize(op.multiply(f(pre(o_in)), h_act(new_c)))
            if lens64 is not None:  # past an entry's length: its state held, its output zero
                live = op.less(relax.const(t, "int64"), lens64)
                out[t] = bb.normalize(op.where(live, new_h, zeros))
                h, c = bb.normalize(op.where(live, new_h, h)), bb.normalize(op.where(live, new_c, c))
            else:
                out[t] = h = new_h
                c = new_c
        ys.append(bb.normalize(op.stack(out, axis=0)))  # [seq, batch, h]
        last_h.append(h)
        last_c.append(c)
    y = bb.normalize(op.stack(ys, axis=1))  # [seq, directions, batch, h]
    y_h = bb.normalize(op.stack(last_h, axis=0))
    y_c = bb.normalize(op.stack(last_c, axis=0))
    if batch_first:
        y = op.permute_dims(y, [2, 0, 1, 3])
        y_h, y_c = op.permute_dims(y_h, [1, 0, 2]), op.permute_dims(y_c, [1, 0, 2])
    results = [bb.normalize(y), bb.normalize(y_h)]
    if kind == "LSTM":
        results.append(bb.normalize(y_c))
    return relax.Tuple(results)
