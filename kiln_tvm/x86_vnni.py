"""x86's VNNI dot product (``vpdpbusd``) as a tensor intrinsic that builds with the LLVM inside TVM 0.27.

TVM registers ``dot_16x4_vnni`` with ``int32x16`` operands for ``llvm.x86.avx512.vpdpbusd.512``; the LLVM
the 0.27 wheel bundles declares that intrinsic over ``<64 x i8>`` vectors, so every tensorized candidate
fails to build (TVM_NOTES.md). The implementation here passes the same bytes as ``uint8x64``/``int8x64``;
the description (16 output lanes, 4 products each: ``C[i] += A[k] * B[i, k]``, u8 x s8 -> s32) is TVM's.
"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

#: The name MetaSchedule's tiling rule and the ``Tensorize`` instructions of traces refer to.
VNNI_INTRINSIC = "dot_16x4_vnni"
#: Output lanes and products per lane of one instruction (the packed weight's inner block: 16 x 4 bytes).
VNNI_LANES, VNNI_DEPTH = 16, 4


@T.prim_func(s_tir=True)
def _vnni_16x4_impl(
    A: T.Buffer((4,), "uint8", offset_factor=1),
    B: T.Buffer((16, 4), "int8", offset_factor=1),
    C: T.Buffer((16,), "int32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        a_word = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
        C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
            C.vload([0], dtype="int32x16"),
            T.reinterpret(T.broadcast(a_word, 16), dtype="uint8x64"),
            B.vload([0, 0], dtype="int8x64"),
            dtype="int32x16",
        )


_registered = False


def register_vnni_intrinsic() -> None:
    """(Re-)register :data:`VNNI_INTRINSIC` with the implementation above, once per process."""
    global _registered
    if _registered:
        return
    from tvm.s_tir.tensor_intrin.x86 import dot_product_16x4_u8i8i32_desc

    TensorIntrin.register(VNNI_INTRINSIC, dot_product_16x4_u8i8i32_desc, _vnni_16x4_impl, override=True)
    _registered = True
