"""Intel AMX's tile multiplies, int8 (``tdpbusd``) and bf16 (``tdpbf16ps``), as families of tensor
intrinsics, and AMX's per-process permission.

TVM 0.27 ships no AMX intrinsic. LLVM's tile intrinsics (``llvm.x86.ldtilecfg``, ``tileloadd64``,
``tdpbusd``, ``tdpbf16ps``, ``tilestored64``) take tile registers as immediates and memory as pointers, so
TVM's codegen expresses them without a new type: bf16 included, which TVM otherwise legalizes to fp32
arithmetic. One ``tdpbusd`` adds to a 16 x 16 int32 tile the products of a 16 x 64 u8 tile of the input
and a 16 x 64-byte tile of the weight in the VNNI order (row ``r``: the 4 reduction elements
``4r..4r+3`` of each of 16 output columns), which is the ``[N/16, K/4, 16, 4]`` packing of
:mod:`tuner.passes.int8_packing`: one packing serves both instructions. ``tdpbf16ps`` is the same with pairs of
bf16 (``[N/16, K/2, 16, 2]``, :mod:`tuner.passes.bf16_packing`) into fp32.

Each intrinsic here computes a block of ``16*rows`` x 32 outputs (``rows`` in {1, 2}: up to 4 accumulator
tiles, 2 input and 2 weight tiles, the 8 registers) over ``depth`` tile rows of reduction (64 int8 or 32
bf16 elements each), loading and storing its accumulators once per call and configuring the tiles on entry
(the configuration is per thread, and a call may run on any thread of the pool).

Linux keeps AMX state off for a process until it asks (``arch_prctl(ARCH_REQ_XCOMP_PERM)``); the first
tile instruction of a process that did not ask dies of SIGILL. :func:`request_amx_permission` asks; Kiln
calls it on import, and libraries Kiln exports with AMX code ask when they are loaded
(:data:`PERMISSION_CONSTRUCTOR_C`).
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

#: Rows and columns of one accumulator tile (32-bit elements).
TILE_ROWS, TILE_COLS = 16, 16
#: The accumulator blocks (tiles down, tiles across) and reduction depths (in tile rows) registered, for
#: each kind: each costs ~0.17 s of TVMScript parsing in every process that registers them. Two weight tiles across always:
#: measured on a Xeon with AMX (512^3), 16 x 32 and 32 x 32 blocks ran 1.3-2x faster than 16 x 16 ones.
BLOCKS = ((1, 2), (2, 2))
DEPTHS = (1, 2, 4, 8, 16)

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def request_amx_permission() -> bool:
    """Ask Linux for AMX tile state for this process (idempotent; all threads). False where the kernel or
    the CPU has no AMX, or the machine is not x86-64 Linux."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0


#: A constructor linked into exported libraries that hold AMX code, so that any process loading one (plain
#: TVM included) has the permission before its first tile instruction.
PERMISSION_CONSTRUCTOR_C = """\
#include <sys/syscall.h>
#include <unistd.h>
__attribute__((constructor)) static void kiln_request_amx_permission(void) {
  syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */);
}
"""


def permission_constructor_object(workdir: Path) -> Path:
    """:data:`PERMISSION_CONSTRUCTOR_C` compiled (system C compiler, position-independent) in ``workdir``."""
    source, obj = workdir / "kiln_amx_permission.c", workdir / "kiln_amx_permission.o"
    source.write_text(PERMISSION_CONSTRUCTOR_C)
    compiler = os.environ.get("CC") or shutil.which("gcc") or "cc"
    subprocess.run(
        [compiler, "-c", "-fPIC", "-O2", str(source), "-o", str(obj)], check=True, capture_output=True
    )
    return obj


@dataclass(frozen=True)
class AmxKind:
    """One of AMX's tile multiplies: operand and accumulator types and the instruction."""

    name: str  # "u8s8s32", "bf16f32"
    a_dtype: str
    b_dtype: str
    acc_dtype: str
    pair: int  # reduction elements per 32-bit group of a weight tile row (4 bytes, 2 bf16)
    instruction: str

    @property
    def depth(self) -> int:
        """Reduction elements in one 64-byte tile row."""
        return 16 * self.pair


INT8 = AmxKind("u8s8s32", "uint8", "int8", "int32", 4, "llvm.x86.tdpbusd")
BF16 = AmxKind("bf16f32", "bfloat16", "bfloat16", "float32", 2, "llvm.x86.tdpbf16ps")
KINDS = (INT8, BF16)


#: What every AMX intrinsic's registered name begins with.
AMX_NAME_PREFIX = "kiln_amx_"


def amx_intrinsic_name(kind: AmxKind, rows: int, cols: int, depth: int) -> str:
    """The registered name of the ``kind`` intrinsic over a ``16*rows`` x ``16*cols`` block, ``depth``
    tile rows deep (``depth * kind.depth`` reduction elements)."""
    return f"{AMX_NAME_PREFIX}{kind.name}_{TILE_ROWS * rows}x{TILE_COLS * cols}x{kind.depth * depth}"


def amx_zero_name(kind: AmxKind, rows: int, cols: int) -> str:
    """The registered name of the intrinsic zeroing the accumulator block of :func:`amx_intrinsic_name`."""
    return f"{AMX_NAME_PREFIX}zero_{kind.acc_dtype}_{TILE_ROWS * rows}x{TILE_COLS * cols}"


def _intrinsic(kind: AmxKind, rows: int, cols: int, depth: int) -> tuple[object, object]:
    """The description and implementation of one block size."""
    m, n, k = TILE_ROWS * rows, TILE_COLS * cols, kind.depth * depth
    pair, kq = kind.pair, k // kind.pair
    a_dtype, b_dtype, acc = kind.a_dtype, kind.b_dtype, kind.acc_dtype
    a_bytes = 64 // kind.depth  # bytes of one input element
    instruction = kind.instruction

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((m, k), a_dtype, offset_factor=1),
        B: T.Buffer((cols, kq, TILE_COLS, pair), b_dtype, offset_factor=1),
        C: T.Buffer((m, n), acc, offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:m, 0:n], A[0:m, 0:k], B[0:cols, 0:kq, 0:TILE_COLS, 0:pair])
            T.writes(C[0:m, 0:n])
            for i, j, r in T.grid(m, n, k):
                with T.sblock("update"):
                    vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                    C[vi, vj] = C[vi, vj] + T.cast(A[vi, vr], acc) * T.cast(
                        B[vj // 16, vr // pair, vj % 16, vr % pair], acc
                    )

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        a_row = T.int32()
        b_block = T.int32()
        c_row = T.int32()
        A = T.match_buffer(a, (m, k), a_dtype, strides=[a_row, 1], offset_factor=1)
        B = T.match_buffer(
            b, (cols, kq, TILE_COLS, pair), b_dtype, strides=[b_block, 16 * pair, pair, 1], offset_factor=1
        )
        C = T.match_buffer(c, (m, n), acc, strides=[c_row, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:m, 0:n], A[0:m, 0:k], B[0:cols, 0:kq, 0:TILE_COLS, 0:pair])
            T.writes(C[0:m, 0:n])
            # The 64-byte tile configuration: palette 1; all 8 tiles 16 rows of 64 bytes.
            config = T.decl_buffer((8,), "uint64", scope="local")
            config[0] = T.uint64(1)
            config[1] = T.uint64(0)
            config[2] = T.uint64(0x0040004000400040)
            config[3] = T.uint64(0x0040004000400040)
            config[4] = T.uint64(0)
            config[5] = T.uint64(0)
            config[6] = T.uint64(0x1010101010101010)
            config[7] = T.uint64(0)
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", T.address_of(config[0])))
            # Tiles 0-3 accumulate, 4-5 hold input rows, 6-7 weight blocks; strides in bytes.
            for t in T.unroll(rows * cols):
                T.evaluate(
                    T.call_llvm_intrin(
                        "void",
                        "llvm.x86.tileloadd64",
                        T.int8(t),
                        T.address_of(C[16 * (t // cols), 16 * (t % cols)]),
                        T.int64(c_row * 4),
                    )
                )
            for step in T.serial(depth):
                for u in T.unroll(rows):
                    T.evaluate(
                        T.call_llvm_intrin(
                            "void",
                            "llvm.x86.tileloadd64",
                            T.int8(4 + u),
                            T.address_of(A[16 * u, (64 // a_bytes) * step]),
                            T.int64(a_row * a_bytes),
                        )
                    )
                for v in T.unroll(cols):
                    T.evaluate(
                        T.call_llvm_intrin(
                            "void",
                            "llvm.x86.tileloadd64",
                            T.int8(6 + v),
                            T.address_of(B[v, 16 * step, 0, 0]),
                            T.int64(64),
                        )
                    )
                for t in T.unroll(rows * cols):
                    T.evaluate(
                        T.call_llvm_intrin(
                            "void", instruction, T.int8(t), T.int8(4 + t // cols), T.int8(6 + t % cols)
                        )
                    )
            for t in T.unroll(rows * cols):
                T.evaluate(
                    T.call_llvm_intrin(
                        "void",
                        "llvm.x86.tilestored64",
                        T.int8(t),
                        T.address_of(C[16 * (t // cols), 16 * (t % cols)]),
                        T.int64(c_row * 4),
                    )
                )

    return desc, impl


def _zero(kind: AmxKind, rows: int, cols: int) -> tuple[object, object]:
    """The block's initial zeros as vector stores (MetaSchedule's tensorizing postprocessor insists on
    an intrinsic, or a single loop, for the init of a tensorized reduction)."""
    m, n, acc = TILE_ROWS * rows, TILE_COLS * cols, kind.acc_dtype

    @T.prim_func(s_tir=True)
    def desc(C: T.Buffer((m, n), acc, offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:m, 0:n])
            for i, j in T.grid(m, n):
                with T.sblock("init"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = T.cast(0, acc)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        c_row = T.int32()
        C = T.match_buffer(c, (m, n), acc, strides=[c_row, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:m, 0:n])
            for i in T.serial(m):
                C[i, T.ramp(0, 1, n)] = T.broadcast(T.cast(0, acc), n)

    return desc, impl


_registered: set[str] = set()


def register_amx_intrinsics() -> None:
    """Register every kind and block size, once per process (records replay them by name)."""
    for kind in KINDS:
        register_amx_kind(kind)


def register_amx_kind(kind: AmxKind) -> None:
    """Register every block size of ``kind``, once per process."""
    if kind.name in _registered:
        return
    for rows, cols in BLOCKS:
        TensorIntrin.register(amx_zero_name(kind, rows, cols), *_zero(kind, rows, cols), override=True)
        for depth in DEPTHS:
            desc, impl = _intrinsic(kind, rows, cols, depth)
            TensorIntrin.register(amx_intrinsic_name(kind, rows, cols, depth), desc, impl, override=True)
    _registered.add(kind.name)
