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

CPUs without VNNI get :data:`AVX2_WORD_DOT` (and AVX-512 ones :data:`AVX512_WORD_DOT`): ``vpmaddwd`` over
int16 operands, 8 (16) output lanes of 2 products each, the u8 input pair widened to int16 and the weights
packed as int16 at compile time. ``vpmaddubsw``, the u8 x s8 instruction of these CPUs, adds its two products
in a *saturating* int16 (255 x 127 x 2 overflows it), so it is exact only on 7-bit weights; int16 products are
exact on any 8-bit weights, at 1.6x the fp32 FMA rate on a Zen 3. Where a weight's values all lie within
[-64, 64] (7-bit weights, as Kiln's quantizer makes them for these CPUs), ``vpmaddubsw`` cannot saturate
(255 x 64 x 2 = 32640): those kernels get :data:`AVX2_BYTE_DOT` (:data:`AVX512_BYTE_DOT`), u8 x s8 pairs
summed to int16 by ``vpmaddubsw`` and pairs of those to int32 by ``vpmaddwd`` against ones, VNNI's
packing and 1.9x the fp32 FMA rate there.
"""

from __future__ import annotations

from dataclasses import dataclass
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
#: ``vpmaddwd`` over int16 operands (u8 inputs widened, s8 weights packed as int16): 8 lanes of 2 products on
#: AVX2, 16 on AVX-512 (AVX512-BW).
AVX2_WORD_INTRINSIC = "kiln_dot_8x2_avx2"
AVX512_WORD_INTRINSIC = "kiln_dot_16x2_avx512bw"
#: ``vpmaddubsw`` then ``vpmaddwd`` by ones over 7-bit weights: 8 lanes of 4 products (16 with AVX512-BW).
AVX2_BYTE_INTRINSIC = "kiln_dot_8x4_avx2_7bit"
AVX512_BYTE_INTRINSIC = "kiln_dot_16x4_avx512bw_7bit"
#: The largest weight magnitude the vpmaddubsw products are exact for: 255 x 64 x 2 fits an int16.
SEVEN_BIT_WEIGHT = 64


@dataclass(frozen=True)
class IntegerDot:
    """One x86 integer dot product that Kiln's integer kernels are tensorized with: its registered
    intrinsic, how it reads the packed weight (``lanes`` output channels by ``depth`` reduction elements,
    each a ``weight_dtype``), and how a report names it."""

    kind: str  # "vnni", "avx-vnni", "avx512", "avx2": the plan's ``integer_kernels``
    intrinsic: str
    lanes: int
    depth: int
    weight_dtype: str  # "int8", or "int16" for the vpmaddwd products
    instruction: str  # in words, e.g. "vpdpbusd zmm"
    llvm_intrinsic: str  # the LLVM intrinsic its implementation calls (in a tensorized kernel's TIR)
    #: The largest weight magnitude it is exact for (None: any 8-bit weight).
    max_weight: int | None = None


_VPDPBUSD, _VPMADDWD = (
    "llvm.x86.avx512.vpdpbusd.{}",
    {8: "llvm.x86.avx2.pmadd.wd", 16: "llvm.x86.avx512.pmaddw.d.512"},
)
VNNI_DOT = IntegerDot(
    "vnni", VNNI_INTRINSIC, VNNI_LANES, VNNI_DEPTH, "int8", "vpdpbusd zmm, AVX512-VNNI", _VPDPBUSD.format(512)
)
AVXVNNI_DOT = IntegerDot(
    "avx-vnni",
    AVXVNNI_INTRINSIC,
    AVXVNNI_LANES,
    VNNI_DEPTH,
    "int8",
    "vpdpbusd ymm, AVX-VNNI",
    _VPDPBUSD.format(256),
)
AVX512_WORD_DOT = IntegerDot(
    "avx512",
    AVX512_WORD_INTRINSIC,
    16,
    2,
    "int16",
    "vpmaddwd zmm on int16 products, AVX512-BW",
    _VPMADDWD[16],
)
AVX2_WORD_DOT = IntegerDot(
    "avx2", AVX2_WORD_INTRINSIC, 8, 2, "int16", "vpmaddwd ymm on int16 products, AVX2", _VPMADDWD[8]
)
_VPMADDUBSW = {8: "llvm.x86.avx2.pmadd.ub.sw", 16: "llvm.x86.avx512.pmaddubs.w.512"}
AVX512_BYTE_DOT = IntegerDot(
    "avx512-7bit",
    AVX512_BYTE_INTRINSIC,
    16,
    VNNI_DEPTH,
    "int8",
    "vpmaddubsw + vpmaddwd zmm on 7-bit weights, AVX512-BW",
    _VPMADDUBSW[16],
    SEVEN_BIT_WEIGHT,
)
AVX2_BYTE_DOT = IntegerDot(
    "avx2-7bit",
    AVX2_BYTE_INTRINSIC,
    8,
    VNNI_DEPTH,
    "int8",
    "vpmaddubsw + vpmaddwd ymm on 7-bit weights, AVX2",
    _VPMADDUBSW[8],
    SEVEN_BIT_WEIGHT,
)
INTEGER_DOTS = (VNNI_DOT, AVXVNNI_DOT, AVX512_WORD_DOT, AVX2_WORD_DOT, AVX512_BYTE_DOT, AVX2_BYTE_DOT)


def _dot_desc(lanes: int, depth: int = VNNI_DEPTH, weight: str = "int8") -> Any:
    """``C[i] += A[k] * B[i, k]`` over ``lanes`` outputs by ``depth`` products, u8 x ``weight`` -> s32 (for
    16 lanes of 4 s8 products: TVM's ``dot_product_16x4_u8i8i32_desc``; 2 int16 ones: ``vpmaddwd``'s)."""

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((depth,), "uint8", offset_factor=1),
        B: T.Buffer((lanes, depth), weight, offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:depth], B[0:lanes, 0:depth])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, depth):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    return desc


def _vpdpbusd_impl(lanes: int) -> Any:
    """One ``vpdpbusd`` over ``lanes`` int32 accumulators (16: ``zmm``, 8: ``ymm``), its operands passed
    as the byte vectors the wheel's LLVM declares."""
    intrinsic = _VPDPBUSD.format(32 * lanes)
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


def _vpmaddwd_impl(lanes: int) -> Any:
    """One ``vpmaddwd`` of the input pair (widened to int16, broadcast) by ``lanes`` int16 weight pairs,
    added to ``lanes`` int32 accumulators: exact, since each product and their sum fit an int32."""
    intrinsic = _VPMADDWD[lanes]
    accumulators, words = f"int32x{lanes}", f"int16x{2 * lanes}"

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((2,), "uint8", offset_factor=1),
        B: T.Buffer((lanes, 2), "int16", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:2], B[0:lanes, 0:2])
            T.writes(C[0:lanes])
            pair = T.reinterpret(T.Cast("int16x2", A.vload([0], "uint8x2")), dtype="int32")
            C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], dtype=accumulators) + T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(intrinsic),
                T.reinterpret(T.broadcast(pair, lanes), dtype=words),
                B.vload([0, 0], dtype=words),
                dtype=accumulators,
            )

    return impl


def _pmaddubsw_impl(lanes: int) -> Any:
    """The input's 4 bytes (broadcast) by ``lanes`` x 4 weight bytes: ``vpmaddubsw`` sums each pair of
    u8 x s8 products into an int16 (exact for weights within +-64), ``vpmaddwd`` against ones sums pairs of
    those into int32, added to the ``lanes`` accumulators."""
    accumulators, words, products = f"int32x{lanes}", f"int16x{2 * lanes}", f"x{4 * lanes}"

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
            pairs = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(_VPMADDUBSW[lanes]),
                T.reinterpret(T.broadcast(a_word, lanes), dtype="uint8" + products),
                B.vload([0, 0], dtype="int8" + products),
                dtype=words,
            )
            C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], dtype=accumulators) + T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(_VPMADDWD[lanes]),
                pairs,
                T.broadcast(T.int16(1), 2 * lanes),
                dtype=accumulators,
            )

    return impl


_registered = False


def register_vnni_intrinsic() -> None:
    """Register :data:`VNNI_INTRINSIC`, :data:`AVXVNNI_INTRINSIC`, the ``vpmaddwd`` ones
    (:data:`AVX2_WORD_INTRINSIC`, :data:`AVX512_WORD_INTRINSIC`) and the 7-bit ``vpmaddubsw`` ones
    (:data:`AVX2_BYTE_INTRINSIC`, :data:`AVX512_BYTE_INTRINSIC`), once per process."""
    global _registered
    if _registered:
        return
    for name, lanes in ((VNNI_INTRINSIC, VNNI_LANES), (AVXVNNI_INTRINSIC, AVXVNNI_LANES)):
        TensorIntrin.register(name, _dot_desc(lanes), _vpdpbusd_impl(lanes), override=True)
    for name, lanes in ((AVX2_WORD_INTRINSIC, 8), (AVX512_WORD_INTRINSIC, 16)):
        TensorIntrin.register(name, _dot_desc(lanes, 2, "int16"), _vpmaddwd_impl(lanes), override=True)
    for name, lanes in ((AVX2_BYTE_INTRINSIC, 8), (AVX512_BYTE_INTRINSIC, 16)):
        TensorIntrin.register(name, _dot_desc(lanes), _pmaddubsw_impl(lanes), override=True)
    _registered = True
