"""Elementwise operations the importers emit as opaque kernels, turned back into Relax operators.

Layout conversion (``ConvertLayout``) moves a Relax operator into the converted layout when the
operator says how (its ``FRelaxInferLayout``); anything else is wrapped in transposes back to the model's
layout. Two common activations arrive in forms it cannot see into:

* ONNX ``Clip`` (ReLU6 and friends): TVM's importer emits it with ``emit_te`` as ``call_tir`` of a
  ``maximum`` and a ``minimum`` PrimFunc;
* ``relax.clip`` (torch.export's ``hardtanh``/``clamp``), which has no layout rule in TVM 0.27.

So between two NHWC convolutions a ReLU6 became ``transpose → maximum → minimum → transpose``: two
data-movement kernels per activation. :func:`elementwise_as_operators` rewrites both forms into
``relax.maximum`` / ``relax.minimum`` with scalar constants, which follow any layout; after
legalization they compute the same expression as before.
"""

from __future__ import annotations

from typing import Any

from kiln_tvm import relax, s_tir, structural_equal, tvm
from tuner.passes.rewrite import rewrite_functions

# TIR binary expression type -> the Relax operator that computes it elementwise.
_TIR_BINARY_OPS: dict[type, Any] = {
    tvm.tirx.Max: relax.op.maximum,
    tvm.tirx.Min: relax.op.minimum,
}
_TensorLoad = tvm.ir.expr.TensorLoad  # a read of a PrimFunc's tensor (TVM 0.27's BufferLoad)
_DATA_PARALLEL = 0  # IterVar kind of a spatial block axis


def elementwise_as_operators() -> tvm.transform.Pass:
    """A module pass: ``call_tir`` of an elementwise max/min against a scalar, and ``relax.clip``, become
    ``relax.maximum`` / ``relax.minimum`` calls. Other calls are left as they are."""

    @tvm.transform.module_pass(opt_level=0, name="KilnElementwiseAsOperators")
    def rewrite(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        return relax.transform.DeadCodeElimination()(rewrite_functions(_ElementwiseMutator(mod)))

    return rewrite


@relax.expr_functor.mutator
class _ElementwiseMutator(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod = mod
        self.call_tir = tvm.ir.Op.get("relax.call_tir")
        self.clip = tvm.ir.Op.get("relax.clip")
        self.recognized: dict[Any, tuple[Any, int, relax.Expr | None] | None] = {}  # by PrimFunc

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if call.op.same_as(self.clip):
            return self._clip(call)
        if call.op.same_as(self.call_tir):
            return self._call_tir(call)
        return call

    def _clip(self, call: relax.Call) -> relax.Expr:
        x, lo, hi = call.args
        dtype = x.ty.dtype
        bounds = [_prim_value(lo), _prim_value(hi)]
        if None in bounds:
            return call
        # min(max(x, lo), hi): when lo > hi every element is hi, as in torch.clamp and ONNX Clip.
        low = relax.op.maximum(x, relax.const(bounds[0], dtype))
        return relax.op.minimum(self.builder_.normalize(low), relax.const(bounds[1], dtype))

    def _call_tir(self, call: relax.Call) -> relax.Expr:
        callee, args = call.args[0], call.args[1]
        if (
            len(call.args) > 2
            or not isinstance(callee, tvm.ir.GlobalVar)
            or not isinstance(args, relax.Tuple)
        ):
            return call  # symbolic-shape arguments, or an unusual form: leave it
        func = self.mod[callee]
        if not isinstance(func, tvm.tirx.PrimFunc):
            return call
        if callee not in self.recognized:
            self.recognized[callee] = _scalar_binary_op(func, len(args.fields))
        op = self.recognized[callee]
        if op is None:
            return call
        relax_op, tensor_index, scalar = op
        tensor = args.fields[tensor_index]
        if not _same_shape(tensor.ty, call.ty):
            return call
        operand = scalar if scalar is not None else args.fields[1 - tensor_index]
        return relax_op(tensor, operand)


def _prim_value(expr: Any) -> float | None:
    """The number a ``relax.clip`` bound holds (an immediate in TVM 0.27), or None when it is symbolic."""
    if isinstance(expr, tvm.tirx.FloatImm | tvm.tirx.IntImm):
        return float(expr.value)
    return None


def _same_shape(lhs: Any, rhs: Any) -> bool:
    if not (isinstance(lhs, relax.TensorType) and isinstance(rhs, relax.TensorType)):
        return False
    if lhs.dtype != rhs.dtype or lhs.shape is None or rhs.shape is None:
        return False
    return structural_equal(lhs.shape, rhs.shape)


def _scalar_binary_op(func: Any, num_args: int) -> tuple[Any, int, relax.Expr | None] | None:
    """If ``func`` is ``out[i...] = op(A[i...], s)`` (``s`` a 0-d tensor or an immediate, either side),
    return (Relax op, index of ``A`` among the call's tensor arguments, the immediate as a constant or
    None when ``s`` is an argument). None for anything else."""
    params = list(func.params)  # TVM 0.27: the tensors themselves, loaded by TensorLoad(source=param)
    if len(params) != num_args + 1:
        return None
    try:
        sch = s_tir.Schedule(tvm.IRModule({"main": func}))
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # no root block or not schedulable: not the simple form this looks for
        return None
    if len(blocks) != 1:
        return None
    block = sch.get(blocks[0])
    store = block.body
    if block.init is not None or not isinstance(store, tvm.tirx.BufferStore) or block.match_buffers:
        return None
    if any(int(iv.iter_type) != _DATA_PARALLEL for iv in block.iter_vars):
        return None
    block_vars = [iv.var for iv in block.iter_vars]
    if not store.buffer.same_as(params[-1]) or not _is_identity(store.indices, block_vars):
        return None
    relax_op = _TIR_BINARY_OPS.get(type(store.value))
    if relax_op is None:
        return None
    full, other = _split_operands(store.value.a, store.value.b, block_vars)
    inputs = params[:-1]
    index = _position(full.source, inputs) if full is not None else None
    if index is None:
        return None
    if isinstance(other, tvm.tirx.FloatImm | tvm.tirx.IntImm):
        # T.max/T.min take operands of one dtype: the immediate's is the output's.
        return (
            (relax_op, index, relax.const(other.value, str(params[-1].ty.dtype))) if num_args == 1 else None
        )
    if isinstance(other, _TensorLoad) and len(other.indices) == 0 and num_args == 2:
        scalar_index = _position(other.source, inputs)
        if scalar_index is not None and scalar_index != index:
            return relax_op, index, None
    return None


def _position(var: Any, params: list[Any]) -> int | None:
    return next((i for i, p in enumerate(params) if var.same_as(p)), None)


def _split_operands(a: Any, b: Any, block_vars: list[Any]) -> tuple[Any, Any]:
    for full, other in ((a, b), (b, a)):
        if isinstance(full, _TensorLoad) and _is_identity(full.indices, block_vars):
            return full, other
    return None, None


def _is_identity(indices: Any, block_vars: list[Any]) -> bool:
    return len(indices) == len(block_vars) and all(
        i.same_as(v) for i, v in zip(indices, block_vars, strict=True)
    )
