"""AVX512-BF16's dot product (``vdpbf16ps``) as a tensor intrinsic, through a few lines of LLVM IR.

``vdpbf16ps zmm`` multiplies 16 pairs of bf16 values by 16 pairs and adds each pair's two products to one
of 16 fp32 accumulators: ``C[i] += A[2i] * B[2i] + A[2i + 1] * B[2i + 1]`` (denormals flushed, fp32
rounding), on Intel since Cooper Lake and AMD since Zen 4. TVM 0.27 cannot call it itself: LLVM declares
``llvm.x86.avx512bf16.dpbf16ps.512`` over ``<32 x bfloat>`` vectors, and TVM's LLVM code generator has no
type for bf16 (its ``BF16ComputeLegalize`` widens bf16 values to fp32 before code generation). So the
intrinsic's implementation calls a function written in LLVM IR, which TVM's ``pragma_import_llvm``
links into the kernel's module and inlines (no call remains: the kernel holds the instruction).

As with VNNI, the weight is packed so that one instruction reads 16 output columns by a pair of reduction
elements (64 contiguous bytes): ``Wp[N/16, K/2, 16, 2]``, AMX-BF16's packing; the input's pair is
broadcast to the 16 lanes. The description is the product the TE kernels compute: ``C[i] += float32(A[k])
* float32(B[i, k])``.
"""

from __future__ import annotations

from typing import Any

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

#: The name Kiln's tiling rule and the ``Tensorize`` instructions of traces refer to.
DPBF16_INTRINSIC = "kiln_dot_16x2_avx512bf16"
#: Output lanes and products per lane of one instruction.
DPBF16_LANES, DPBF16_PAIR = 16, 2
_FUNCTION = "kiln_dpbf16ps_16x2"

# C (fp32), A (a bf16 pair, broadcast), B (16 bf16 pairs), each a base pointer and an element offset:
# TVM's access_ptr of a bf16 buffer does not survive its bf16 legalization, its data pointer does. The
# call must match this signature exactly (i32 offsets, an i32 result, as call_extern's), or LLVM keeps
# the call instead of inlining it, and the function stays undefined.
_LLVM_IR = f"""
define i32 @{_FUNCTION}(ptr %c_data, i32 %c_offset, ptr %a_data, i32 %a_offset, ptr %b_data, i32 %b_offset) {{
entry:
  %c = getelementptr float, ptr %c_data, i32 %c_offset
  %a = getelementptr i16, ptr %a_data, i32 %a_offset
  %b = getelementptr i16, ptr %b_data, i32 %b_offset
  %acc = load <16 x float>, ptr %c, align 4
  %pair = load i32, ptr %a, align 2
  %first = insertelement <16 x i32> poison, i32 %pair, i64 0
  %pairs = shufflevector <16 x i32> %first, <16 x i32> poison, <16 x i32> zeroinitializer
  %a_vec = bitcast <16 x i32> %pairs to <32 x bfloat>
  %b_vec = load <32 x bfloat>, ptr %b, align 2
  %sum = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %a_vec, <32 x bfloat> %b_vec)
  store <16 x float> %sum, ptr %c, align 4
  ret i32 0
}}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
"""


def _dpbf16_functions() -> tuple[Any, Any]:
    """The intrinsic's description and implementation, parsed when it is registered (TVMScript's parser
    walks the caller's stack: 0.4-2.6 s in a process that has imported PyTorch, which the importers of
    :data:`DPBF16_INTRINSIC` need not pay)."""

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((2,), "bfloat16", offset_factor=1),
        B: T.Buffer((16, 2), "bfloat16", offset_factor=1),
        C: T.Buffer((16,), "float32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 2):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "float32") * T.cast(B[vi, vk], "float32")

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((2,), "bfloat16", offset_factor=1),
        B: T.Buffer((16, 2), "bfloat16", offset_factor=1),
        C: T.Buffer((16,), "float32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            with T.attr(T.int32(0), "pragma_import_llvm", _LLVM_IR):
                T.evaluate(
                    T.call_extern(
                        "int32",
                        _FUNCTION,
                        C.data,
                        T.Cast("int32", C.elem_offset),
                        A.data,
                        T.Cast("int32", A.elem_offset),
                        B.data,
                        T.Cast("int32", B.elem_offset),
                    )
                )

    return desc, impl


_registered = False


def register_dpbf16_intrinsic() -> None:
    """Register :data:`DPBF16_INTRINSIC`, once per process."""
    global _registered
    if not _registered:
        TensorIntrin.register(DPBF16_INTRINSIC, *_dpbf16_functions(), override=True)
        _registered = True
