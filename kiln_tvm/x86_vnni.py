"""x86's VNNI dot product (``vpdpbusd``) as tensor intrinsics that build with the LLVM inside TVM 0.27.

TVM registers ``dot_16x4_vnni`` with ``int32x16`` operands for ``llvm.x86.avx512.vpdpbusd.512``; the LLVM
the 0.27 wheel bundles declares that intrinsic over ``<64 x i8>`` vectors, so every tensorized candidate
fails to build (TVM_NOTES.md). Kiln's :data:`VNNI_INTRINSIC` passes the same bytes as ``uint8x64``/``int8x64``;
the description (16 output lanes, 4 products each: ``C[i] += A[k] * B[i, k]``, u8 x s8 -> s32) is TVM's,
written here for both widths.

CPUs with AVX-VNNI but no AVX-512 (Intel since Alder Lake; the VEX-encoded ``vpdpbusd ymm``) get
:data:`AVXVNNI_INTRINSIC`, the same product over 8 output lanes on 256-bit vectors, which TVM does not
have: LLVM's ``llvm.x86.avx512.vpdpbusd.256`` selects the VEX encoding on a target with ``avxvnni`` and
without AVX512-VL.
"""

from __future__ import annotations

from typing import Any

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

#: The name Kiln's tiling rule and the ``Tensorize`` instructions of traces refer to. Kiln's own, not
#: TVM's ``dot_16x4_vnni``: a process that imports TVM's x86 intrinsics gets TVM's under that name, which does
#: not build, and plain TVM reading Kiln's records must get this one (artifacts ship
#: :mod:`tuner.intrinsics_module`'s module that registers it).
VNNI_INTRINSIC = "kiln_dot_16x4_vnni"
#: Output lanes and products per lane of one instruction (the packed weight's inner block: 16 x 4 bytes).
VNNI_LANES, VNNI_DEPTH = 16, 4
#: The 256-bit product (AVX-VNNI): 8 output lanes of 4 products (a 32-byte weight block).
AVXVNNI_INTRINSIC = "kiln_dot_8x4_avxvnni"
AVXVNNI_LANES = 8


def _dot_desc(lanes: int) -> Any:
    """``C[i] += A[k] * B[i, k]`` over ``lanes`` outputs by 4 products, u8 x s8 -> s32 (for 16 lanes: TVM's
    ``dot_product_16x4_u8i8i32_desc``)."""

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((4,), "uint8", offset_factor=1),
        B: T.Buffer((lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    return desc


def _vpdpbusd_impl(lanes: int) -> Any:
    """One ``vpdpbusd`` over ``lanes`` int32 accumulators (16: ``zmm``, 8: ``ymm``), its operands passed
    as the byte vectors the wheel's LLVM declares."""
    intrinsic = f"llvm.x86.avx512.vpdpbusd.{32 * lanes}"
    accumulators, products = f"int32x{lanes}", f"x{4 * lanes}"

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((4,), "uint8", offset_factor=1),
        B: T.Buffer((lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            a_word = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(intrinsic),
                C.vload([0], dtype=accumulators),
                T.reinterpret(T.broadcast(a_word, lanes), dtype="uint8" + products),
                B.vload([0, 0], dtype="int8" + products),
                dtype=accumulators,
            )

    return impl


def vnni_intrinsic(lanes: int) -> str:
    """The registered intrinsic for a VNNI product of ``lanes`` output lanes (16: AVX512-VNNI, 8: AVX-VNNI)."""
    return {VNNI_LANES: VNNI_INTRINSIC, AVXVNNI_LANES: AVXVNNI_INTRINSIC}[lanes]


_registered = False


def register_vnni_intrinsic() -> None:
    """Register :data:`VNNI_INTRINSIC` and :data:`AVXVNNI_INTRINSIC`, once per process."""
    global _registered
    if _registered:
        return
    for name, lanes in ((VNNI_INTRINSIC, VNNI_LANES), (AVXVNNI_INTRINSIC, AVXVNNI_LANES)):
        TensorIntrin.register(name, _dot_desc(lanes), _vpdpbusd_impl(lanes), override=True)
    _registered = True
