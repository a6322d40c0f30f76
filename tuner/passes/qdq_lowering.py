"""QDQ convolutions and matmuls lowered to integer arithmetic (a Relax pass run before constant folding).

TVM's ONNX importer turns a QDQ model into ``quantize``/``dequantize`` calls around float operators, and
constant folding then dequantizes the weights: the model runs in fp32. This pass finds

    quantize(act(core(dequantize(x), dequantize(W)) [+ bias]), s_y, z_y)

where ``core`` is ``matmul`` (``W`` constant ``[K, N]``, possibly a transposed constant) or ``conv2d``
(``W`` constant ``OIHW``, any groups), ``bias`` a constant (float or a dequantized int32) and ``act``
ReLU or a max/min against constants (clips, as tuner.passes.elementwise rewrites them), and replaces it by

    acc   = core(x_u8, W_s8, out_dtype=int32) - zero-point corrections       (exact in int32)
    y_q   = saturate(round_half_even(float(acc) * s_x*s_w[c]/s_y + bias[c]/s_y) + z_y)

with per-tensor activation and per-channel weight parameters, as ONNX defines QLinearConv and
onnxruntime's MLAS computes it (the float reference differs by at most one step, on ties). Signed
activations are shifted to u8 (``x + 128``, ``z_x + 128``: the differences ``x - z_x`` are unchanged), the
operand order x86's integer dot products need; unsigned weights are shifted to s8 the same way. A
convolution's input is padded explicitly with its zero point, so the corrections hold at the borders.
The activation is applied before rounding, on the output's scale: quantization is monotonic, so this is
the activation in the quantized domain.

A core whose output no quantize takes (onnxruntime's quantizer leaves the outputs of convolutions and
matmuls in float when asked) is computed in integers all the same, its output ``float(acc) * s_x * s_w[c]``
and what follows it (bias, activation) in float: the rounding of every output to 8 bits is skipped,
which is where much of a quantized model's error comes from.

What does not match (a weight computed at run time, per-channel activation scales...) stays in float and
is listed, with the reason, in the pass' :class:`QuantReport`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln_tvm import RelaxConstant, relax, tvm
from tuner.entities import KeptFloat
from tuner.passes.rewrite import rewrite_functions

_CORE_OPS = ("relax.matmul", "relax.nn.conv2d")
# relax.clip arrives as maximum/minimum: tuner.passes.elementwise runs first
_ACTIVATION_OPS = ("relax.nn.relu", "relax.maximum", "relax.minimum")
_LAYOUT_OPS = ("relax.reshape", "relax.permute_dims", "relax.nn.max_pool2d", "relax.flatten")


@dataclass
class QuantReport:
    """What the lowering did to one module: the operators now computed in integers, and those kept in float."""

    lowered: list[str] = field(default_factory=list)  # "conv2d 1x3x32x32 * 16x3x3x3 -> int8"
    kept_float: list[KeptFloat] = field(default_factory=list)


class _Declined(Exception):
    """The chain under a quantize is not one this pass lowers; the message says why."""


def lower_qdq(report: QuantReport | None = None) -> tvm.transform.Pass:
    """A module pass lowering QDQ convolutions and matmuls to integer ops; ``report`` collects what it did."""
    sink = report if report is not None else QuantReport()

    @tvm.transform.module_pass(opt_level=0, name="KilnLowerQDQ")
    def rewrite(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        eliminate = relax.transform.DeadCodeElimination()
        requantized = _QDQMutator(mod, sink)
        lowered = eliminate(rewrite_functions(requantized))
        # What no quantize claimed: cores whose output goes on in float.
        floats = _QDQMutator(lowered, sink, declined=requantized.declined, float_outputs=True)
        result = eliminate(rewrite_functions(floats))
        floats.report_float_leftovers(lowered)
        return result

    return rewrite


# --------------------------------------------------------------------------------------------------
# Matching


@dataclass(frozen=True)
class _QParams:
    """A dequantize's operands: the integer tensor and its scale and zero point (numpy, broadcastable)."""

    data: Any  # relax expression (activations) or numpy array (constant weights)
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int


@dataclass(frozen=True)
class _Chain:
    core: relax.Call
    x: _QParams
    w: _QParams  # weights as numpy, in the core's layout ([K, N] or OIHW), channel axis ``axis``
    bias: np.ndarray | None  # float, per output channel
    activation: tuple[float, float]  # bounds applied to the float output before quantizing


@relax.expr_functor.mutator
class _QDQMutator(relax.PyExprMutator):
    """Lowers each core a quantize takes (with ``float_outputs``, instead each core left over by such a
    run: those whose output goes on in float)."""

    def __init__(
        self,
        mod: tvm.IRModule,
        report: QuantReport,
        *,
        declined: dict[Any, str] | None = None,
        float_outputs: bool = False,
    ) -> None:
        super().__init__(mod)
        self.report = report
        self.float_outputs = float_outputs
        self.quantize = tvm.ir.Op.get("relax.quantize")
        self.dequantize = tvm.ir.Op.get("relax.dequantize")
        # Keyed by the input module's core calls (TVM objects hash by identity).
        self.declined: dict[Any, str] = dict(declined or {})  # core call -> why it was not lowered
        self.lowered_cores: set[Any] = set()

    # The bindings are looked up in the input function: the chain is matched before it is rewritten.
    def _producer(self, expr: relax.Expr) -> relax.Expr:
        while isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            if bound is None:
                return expr
            expr = bound
        return expr

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        if self.float_outputs:
            return self._lower_float_output(call)
        if not call.op.same_as(self.quantize):
            return super().visit_call_(call)
        moved = self._layout_on_integers(call)
        if moved is not None:
            return moved
        try:
            chain = self._match(call)
        except _Declined as why:
            core = self._core_under(call.args[0])
            if core is not None:
                self.declined[core] = str(why)
            return super().visit_call_(call)
        if chain is None:
            return super().visit_call_(call)
        return self._lower(chain, call)

    def _lower_float_output(self, call: relax.Call) -> relax.Expr:
        """A core over a dequantized input and weight whose output no quantize took, computed in integers
        all the same: ``float(acc) * s_x * s_w[c]`` is what the float operator computes on the dequantized
        operands; the bias and what follows stay in float."""
        if str(getattr(call.op, "name", "")) not in _CORE_OPS:
            return super().visit_call_(call)
        try:
            chain = self._core_chain(call, None, (-np.inf, np.inf))
        except _Declined as why:
            self.declined.setdefault(call, str(why))
            return super().visit_call_(call)
        accumulated = None if chain is None else self._accumulate(chain, len(call.ty.shape))
        if chain is None or accumulated is None:
            return super().visit_call_(call)
        acc, shape = accumulated
        self.report.lowered.append(f"{describe_core(chain.core)} -> float32")
        return self._scaled(chain, acc, shape, 1.0)

    def _scalar_value(self, expr: relax.Expr) -> float | None:
        """The value of a scalar built from constants only (ONNX Clip's bounds arrive as
        ``where(isnan(c), -inf, c)``), or None."""
        expr = self._producer(expr)
        value = _scalar_constant(expr)
        if value is not None or not (isinstance(expr, relax.Call) and hasattr(expr.op, "name")):
            return value
        name = str(expr.op.name)
        if name == "relax.isnan":
            inner = self._scalar_value(expr.args[0])
            return None if inner is None else float(np.isnan(inner))
        if name == "relax.where":
            cond, then, other = (self._scalar_value(a) for a in expr.args)
            if None in (cond, then, other):
                return None
            return then if cond else other
        return None

    def _layout_on_integers(self, q: relax.Call) -> relax.Expr | None:
        """``quantize(L(dequantize(x, s, z)), s, z)`` is ``L(x)`` when ``L`` only moves or selects elements
        (a reshape, a transpose, a max-pool: the largest value stays the largest once quantized)."""
        layout = self._producer(q.args[0])
        if not (isinstance(layout, relax.Call) and str(getattr(layout.op, "name", "")) in _LAYOUT_OPS):
            return None
        dq = self._producer(layout.args[0])
        if not (isinstance(dq, relax.Call) and dq.op.same_as(self.dequantize)):
            return None
        params = [_scalar_constant(self._producer(a)) for a in (*dq.args[1:], *q.args[1:])]
        if None in params or params[:2] != params[2:]:
            return None
        if str(dq.args[0].ty.dtype) != str(q.attrs.out_dtype):
            return None
        data = self.visit_expr(dq.args[0])
        return relax.Call(layout.op, [data, *layout.args[1:]], layout.attrs, layout.ty_args)

    def _core_under(self, expr: relax.Expr) -> relax.Call | None:
        for _ in range(6):
            expr = self._producer(expr)
            if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
                return None
            if str(expr.op.name) in _CORE_OPS:
                return expr
            expr = expr.args[0]
        return None

    def _match(self, q: relax.Call) -> _Chain | None:
        low, high = -np.inf, np.inf
        expr = self._producer(q.args[0])
        bias: np.ndarray | None = None
        while isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            name = str(expr.op.name)
            if bias is not None and name in _ACTIVATION_OPS:
                raise _Declined("an activation before its bias")
            if name == "relax.nn.relu":
                low = max(low, 0.0)
            elif name in ("relax.maximum", "relax.minimum"):
                bound = self._scalar_value(expr.args[1])
                if bound is None:
                    raise _Declined(f"a {name.removeprefix('relax.')} against a tensor computed at run time")
                low, high = (max(low, bound), high) if name == "relax.maximum" else (low, min(high, bound))
            elif name == "relax.add" and bias is None:
                core = self._producer(expr.args[0])
                bias = self._bias(self._producer(expr.args[1]))
                if bias is None:
                    core, bias = self._producer(expr.args[1]), self._bias(self._producer(expr.args[0]))
                if bias is None:
                    raise _Declined("an addition of a tensor computed at run time (not a constant bias)")
                expr = core
                continue
            else:
                break
            expr = self._producer(expr.args[0])
        if not (isinstance(expr, relax.Call) and str(getattr(expr.op, "name", "")) in _CORE_OPS):
            return None
        if _scalar_constant(q.args[1]) is None or _scalar_constant(q.args[2]) is None:
            raise _Declined("its output has per-channel quantization parameters")
        return self._core_chain(expr, bias, (low, high))

    def _core_chain(
        self, core: relax.Call, bias: np.ndarray | None, activation: tuple[float, float]
    ) -> _Chain | None:
        """``core`` over a dequantized input and a dequantized constant weight as a chain to lower (None
        when its input is not dequantized: a float operator)."""
        expr = core
        x, w = self._dequantized(expr.args[0]), self._dequantized(expr.args[1])
        if x is None:
            return None  # a float operator that happens to feed a quantize: nothing quantized to keep
        if isinstance(x.data, np.ndarray):
            raise _Declined("its constant is the left operand (x @ W is lowered)")
        if w is None:
            raise _Declined("its weight is not a dequantized constant")
        if x.scale.size != 1 or x.zero_point.size != 1:
            raise _Declined("its input has per-channel scales (only per-tensor activations are lowered)")
        w = self._weight_layout(expr, w)
        channels = w.data.shape[w.axis]
        if bias is not None and bias.size not in (1, channels):
            raise _Declined(f"its bias has {bias.size} values for {channels} output channels")
        if bias is not None and bias.size == 1:
            bias = np.full(channels, bias.item(), np.float32)
        return _Chain(core=expr, x=x, w=w, bias=bias, activation=activation)

    def _dequantized(self, expr: relax.Expr) -> _QParams | None:
        """The operands of a dequantize (through a transpose of a constant), or None if not dequantized."""
        expr = self._producer(expr)
        permutation = None
        if isinstance(expr, relax.Call) and str(getattr(expr.op, "name", "")) == "relax.permute_dims":
            permutation = expr.attrs.axes
            expr = self._producer(expr.args[0])
        if not (isinstance(expr, relax.Call) and expr.op.same_as(self.dequantize)):
            return None
        data, scale, zero = (self._producer(a) for a in expr.args)
        if not (isinstance(scale, RelaxConstant) and isinstance(zero, RelaxConstant)):
            return None
        axis = int(expr.attrs.axis)
        scale_np, zero_np = scale.value.numpy(), zero.value.numpy()
        if isinstance(data, RelaxConstant):
            values = data.value.numpy()
            axis = axis % values.ndim
            if permutation is not None:
                order = [int(a) for a in permutation] if permutation else list(range(values.ndim))[::-1]
                values, axis = np.transpose(values, order), order.index(axis)
            return _QParams(values, scale_np, zero_np, axis)
        if permutation is not None:
            return None
        return _QParams(expr.args[0], scale_np, zero_np, axis)

    def _weight_layout(self, core: relax.Call, w: _QParams) -> _QParams:
        if not isinstance(w.data, np.ndarray):
            raise _Declined("its weight is computed at run time")
        name = str(core.op.name)
        if name == "relax.matmul":
            if w.data.ndim != 2:
                raise _Declined(f"its weight has rank {w.data.ndim} (a 2-d constant is lowered)")
            channel_axis = 1
        else:
            attrs = core.attrs
            if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
                raise _Declined(
                    f"its layout is {attrs.data_layout}/{attrs.kernel_layout} (NCHW/OIHW is lowered)"
                )
            channel_axis = 0
        if w.scale.size != 1 and w.axis != channel_axis:
            raise _Declined("its weight scales are not per output channel")
        return w if w.axis == channel_axis else _QParams(w.data, w.scale, w.zero_point, channel_axis)

    def _bias(self, expr: relax.Expr) -> np.ndarray | None:
        """A constant bias as float32 per output channel (through a reshape and a dequantize), or None."""
        if isinstance(expr, relax.Call) and str(getattr(expr.op, "name", "")) == "relax.reshape":
            expr = self._producer(expr.args[0])
        if isinstance(expr, RelaxConstant):
            values = expr.value.numpy()
            return values.reshape(-1).astype(np.float32) if values.dtype.kind == "f" else None
        if isinstance(expr, relax.Call) and expr.op.same_as(self.dequantize):
            data, scale, zero = (self._producer(a) for a in expr.args)
            if all(isinstance(a, RelaxConstant) for a in (data, scale, zero)):
                ints = data.value.numpy().astype(np.float64)
                values = (ints - zero.value.numpy().astype(np.float64)) * scale.value.numpy().astype(
                    np.float64
                )
                return values.reshape(-1).astype(np.float32)
        return None

    # ----------------------------------------------------------------------------------------------
    # Rewriting

    def _accumulate(self, chain: _Chain, rank: int) -> tuple[relax.Expr, list[int]] | None:
        """The exact int32 accumulator of ``chain``'s core, ``sum (x - zx)(w - zw)`` per output element,
        and the shape its per-channel constants broadcast to (None, the reason recorded, when the input
        is not an 8-bit integer)."""
        x_expr = self.visit_expr(chain.x.data)
        x_dtype = str(chain.x.data.ty.dtype) if hasattr(chain.x.data, "ty") else ""
        if x_dtype not in ("int8", "uint8"):
            self.declined[chain.core] = f"its input is {x_dtype or 'of unknown type'} (int8/uint8 is lowered)"
            return None
        zx = int(chain.x.zero_point.item())
        if x_dtype == "int8":
            x_expr, zx = _shift_to_uint8(self.builder_, x_expr), zx + 128
        weights, zw = _weights_as_int8(chain.w)
        channels = weights.shape[chain.w.axis]
        is_conv = str(chain.core.op.name) == "relax.nn.conv2d"
        if is_conv:
            x_expr = _padded_input(self.builder_, chain.core, x_expr, zx)
            core = _integer_conv2d(self.builder_, chain.core, x_expr, weights)
        else:
            core = _integer_matmul(self.builder_, x_expr, weights)
        # acc = sum (x - zx)(w - zw) = sum x w - zx sum w - zw sum x + K zx zw   (per output channel c)
        correction = zx * core.weight_sums - core.reduced * zx * zw
        shape = [1, channels, 1, 1] if is_conv else [*([1] * (rank - 1)), channels]
        acc = self.builder_.emit(relax.op.subtract(core.acc, _const(correction.reshape(shape), "int32")))
        if np.any(zw != 0):
            sums = (
                _window_sums(self.builder_, chain.core, x_expr, weights)
                if is_conv
                else _row_sums(self.builder_, x_expr)
            )
            term = self.builder_.emit(relax.op.multiply(sums, _const(zw.reshape(shape), "int32")))
            acc = self.builder_.emit(relax.op.subtract(acc, term))
        self.lowered_cores.add(chain.core)
        return acc, shape

    def _scaled(self, chain: _Chain, acc: relax.Expr, shape: list[int], divisor: float) -> relax.Expr:
        """``float(acc) * s_x * s_w[c] / divisor``: the core's float output, on the scale ``divisor``."""
        channels = chain.w.data.shape[chain.w.axis]
        sw = np.broadcast_to(chain.w.scale.astype(np.float64).reshape(-1), (channels,))
        multiplier = (float(chain.x.scale.item()) * sw / divisor).astype(np.float32).reshape(shape)
        return self.builder_.emit(
            relax.op.multiply(relax.op.astype(acc, "float32"), _const(multiplier, "float32"))
        )

    def _lower(self, chain: _Chain, q: relax.Call) -> relax.Expr:
        accumulated = self._accumulate(chain, len(q.ty.shape))
        if accumulated is None:
            return super().visit_call_(q)
        acc, shape = accumulated
        sy = float(_scalar_constant(self._producer(q.args[1])))
        zy = int(_scalar_constant(self._producer(q.args[2])))
        value = self._scaled(chain, acc, shape, sy)
        if chain.bias is not None:
            offset = (chain.bias.astype(np.float64) / sy).astype(np.float32).reshape(shape)
            value = self.builder_.emit(relax.op.add(value, _const(offset, "float32")))
        low, high = chain.activation
        if low > -np.inf:
            value = self.builder_.emit(relax.op.maximum(value, relax.const(low / sy, "float32")))
        if high < np.inf:
            value = self.builder_.emit(relax.op.minimum(value, relax.const(high / sy, "float32")))
        out_dtype = str(q.attrs.out_dtype)
        info = np.iinfo(out_dtype)
        rounded = self.builder_.emit(relax.op.add(relax.op.round(value), relax.const(float(zy), "float32")))
        # max/min rather than clip: they follow any layout (ConvertLayout has no rule for clip).
        floor = self.builder_.emit(relax.op.maximum(rounded, relax.const(float(info.min), "float32")))
        saturated = relax.op.minimum(floor, relax.const(float(info.max), "float32"))
        self.report.lowered.append(f"{describe_core(chain.core)} -> {out_dtype}")
        return relax.op.astype(self.builder_.emit(saturated), out_dtype)

    def report_float_leftovers(self, original: tvm.IRModule) -> None:
        """List the operators of ``original`` (the module before the rewrite) that take a dequantized
        input and were not lowered, with the reason recorded for each."""
        for _, func in original.functions.items():
            if not isinstance(func, relax.Function):
                continue
            cores: list[relax.Call] = []

            def visit(expr: Any, cores: list[relax.Call] = cores) -> None:
                if isinstance(expr, relax.Call) and str(getattr(expr.op, "name", "")) in _CORE_OPS:
                    cores.append(expr)

            relax.analysis.post_order_visit(func.body, visit)
            for core in cores:
                if core in self.lowered_cores:
                    continue
                inputs = [self._producer(a) for a in core.args[:2]]
                if any(isinstance(a, relax.Call) and a.op.same_as(self.dequantize) for a in inputs):
                    reason = self.declined.get(core, "its output is not quantized")
                    self.report.kept_float.append(KeptFloat(_op_short(core), _shapes(core), reason))


# --------------------------------------------------------------------------------------------------
# The integer operators


def _shift_to_uint8(builder: Any, x: relax.Expr) -> relax.Expr:
    widened = relax.op.add(relax.op.astype(x, "int16"), relax.const(128, "int16"))
    return builder.emit(relax.op.astype(builder.emit(widened), "uint8"))


def _weights_as_int8(w: _QParams) -> tuple[np.ndarray, np.ndarray]:
    """The weights as int8 and their zero points per output channel (int64); u8 weights shifted by -128."""
    values = w.data.astype(np.int64)
    channels = values.shape[w.axis]
    zero = np.broadcast_to(w.zero_point.astype(np.int64).reshape(-1), (channels,)).copy()
    if w.data.dtype == np.uint8:
        values, zero = values - 128, zero - 128
    elif w.data.dtype != np.int8:
        raise _Declined(f"its weights are {w.data.dtype} (int8/uint8 is lowered)")
    return values.astype(np.int8), zero


@dataclass(frozen=True)
class _Integer:
    """An integer core's accumulator, its weights' sums per output channel and its reduction length."""

    acc: relax.Expr
    weight_sums: np.ndarray
    reduced: int


def _integer_matmul(builder: Any, x: relax.Expr, weights: np.ndarray) -> _Integer:
    acc = builder.emit(relax.op.matmul(x, _const(weights, "int8"), out_dtype="int32"))
    return _Integer(acc, weights.astype(np.int64).sum(axis=0), weights.shape[0])


def _padded_input(builder: Any, core: relax.Call, x: relax.Expr, zx: int) -> relax.Expr:
    top, left, bottom, right = (int(p) for p in core.attrs.padding)
    if not any((top, left, bottom, right)):
        return x
    return builder.emit(relax.op.nn.pad(x, [0, 0, 0, 0, top, bottom, left, right], "constant", float(zx)))


def _conv(core: relax.Call, x: relax.Expr, weights: relax.Expr) -> relax.Expr:
    attrs = core.attrs
    return relax.op.nn.conv2d(
        x,
        weights,
        strides=[int(s) for s in attrs.strides],
        padding=[0, 0, 0, 0],
        dilation=[int(d) for d in attrs.dilation],
        groups=int(attrs.groups),
        out_dtype="int32",
    )


def _integer_conv2d(builder: Any, core: relax.Call, padded: relax.Expr, weights: np.ndarray) -> _Integer:
    acc = builder.emit(_conv(core, padded, _const(weights, "int8")))
    return _Integer(
        acc,
        weights.astype(np.int64).reshape(weights.shape[0], -1).sum(axis=1),
        int(np.prod(weights.shape[1:])),
    )


def _row_sums(builder: Any, x: relax.Expr) -> relax.Expr:
    return builder.emit(relax.op.sum(relax.op.astype(x, "int32"), axis=[-1], keepdims=True))


def _window_sums(builder: Any, core: relax.Call, padded: relax.Expr, weights: np.ndarray) -> relax.Expr:
    """Per output element, the sum of the zero-point-padded input under its window: a convolution with
    ones (one output channel unless grouped)."""
    groups = int(core.attrs.groups)
    ones_shape = (1, *weights.shape[1:]) if groups == 1 else weights.shape
    return builder.emit(_conv(core, padded, _const(np.ones(ones_shape, np.int8), "int8")))


def _const(values: np.ndarray, dtype: str) -> RelaxConstant:
    return relax.const(np.ascontiguousarray(values).astype(dtype), dtype)


# --------------------------------------------------------------------------------------------------
# Small readers


def _scalar_constant(expr: Any) -> float | None:
    if isinstance(expr, RelaxConstant) and expr.value.numpy().size == 1:
        return float(expr.value.numpy().item())
    return None


def _op_short(core: relax.Call) -> str:
    return str(core.op.name).rsplit(".", 1)[-1]


def _shape_text(expr: Any) -> str:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    if shape is None:
        return "?"
    return "x".join(str(int(d)) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in shape)


def _shapes(core: relax.Call) -> str:
    joiner = " @ " if _op_short(core) == "matmul" else " * "
    return joiner.join(_shape_text(a) for a in core.args[:2])


def describe_core(core: relax.Call) -> str:
    """``conv2d 1x3x32x32 * 16x3x3x3``: a core operator and its operands' shapes."""
    return f"{_op_short(core)} {_shapes(core)}"
