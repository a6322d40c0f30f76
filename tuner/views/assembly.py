"""The machine code of a compiled model, kernel by kernel, and which instructions each kernel uses.

LLVM writes one assembly text for all of a model's kernels. TVM emits each kernel ``k`` as a few
functions: ``__tvm_ffi_k`` (the calling convention's wrapper), ``k_compute_`` (the loop nest) and, for
parallel loops, closures (``.L__tvm_parallel_lambda...``, local symbols written right after the function
that launches them). :func:`split_functions` files each closure under that function and
:func:`kernel_assembly` gathers a kernel's;
:func:`instruction_mix` counts what a user checks first: whether the arithmetic is vectorised and at
which width (``vfmadd231ps zmm`` against scalar ``vfmadd231ss``), and which dot-product instructions the
tensorized kernels use (VNNI's ``vpdpbusd``, AVX512-BF16's ``vdpbf16ps``, AMX's ``tdpbusd``/``tdpbf16ps``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

_FUNCTION = re.compile(r"^\s*\.type\s+([\w.$]+),\s*@function\s*$", re.MULTILINE)
_INSTRUCTION = re.compile(r"^\s+([a-z][a-z0-9.]*)\b(.*)$")
_REGISTER = re.compile(r"%(zmm|ymm|xmm)\d+")
#: Dot-product and tile instructions of the tensorized kernels.
DOT_PRODUCTS = ("vpdpbusd", "vpdpbusds", "vdpbf16ps", "tdpbusd", "tdpbf16ps", "vpmaddubsw", "vpmaddwd")
_SCALAR_SUFFIXES = ("ss", "sd")
_PARALLEL_CLOSURE = "__tvm_parallel_lambda"


def split_functions(asm: str) -> dict[str, str]:
    """The assembly of each function (by its ``.type name,@function`` directive), in order of appearance;
    a parallel closure's is appended to the function before it."""
    starts = [(m.group(1), m.start()) for m in _FUNCTION.finditer(asm)]
    functions: dict[str, str] = {}
    owner = None
    for (name, start), nxt in zip(starts, [*starts[1:], (None, len(asm))], strict=True):
        text = asm[start : nxt[1]]
        if _PARALLEL_CLOSURE in name and owner is not None:
            functions[owner] += text
            continue
        functions[name] = text
        owner = name
    return functions


def kernel_assembly(functions: dict[str, str], kernel: str) -> str:
    """The functions of one kernel as it runs per inference (its wrapper, its loop nest and its parallel
    closures), joined. A kernel whose weights are laid out at load time (MetaSchedule's layout rewrite)
    was split in two, ``k_weight_prepack`` (run once) and ``k_prepacked`` (run per inference): the
    latter's."""
    for symbol in (f"{kernel}_prepacked", kernel):
        own = [
            text
            for name, text in functions.items()
            if name in (f"__tvm_ffi_{symbol}", symbol) or name.startswith(f"{symbol}_compute_")
        ]
        if own:
            return "".join(own)
    return ""


def instruction_mix(asm: str) -> dict[str, Any]:
    """Counts of the instructions in ``asm``: all of them, the floating-point FMAs by register width
    (``zmm`` 512-bit, ``ymm`` 256, ``xmm`` 128, ``scalar``), the dot-product instructions, and the widest
    vector register any instruction uses (0 when none)."""
    total = 0
    fma: Counter[str] = Counter()
    dots: Counter[str] = Counter()
    widest = 0
    for line in asm.splitlines():
        match = _INSTRUCTION.match(line)
        if match is None or match.group(1).startswith("."):
            continue
        total += 1
        mnemonic, operands = match.group(1), match.group(2)
        registers = set(_REGISTER.findall(operands))
        width = max((_WIDTH[r] for r in registers), default=0)
        widest = max(widest, width)
        if mnemonic in DOT_PRODUCTS:
            dots[mnemonic] += 1
        elif re.fullmatch(r"v?fn?m(add|sub)\d{3}(ps|pd|ss|sd)", mnemonic):
            kind = "scalar" if mnemonic.endswith(_SCALAR_SUFFIXES) else _NAME[width]
            fma[kind] += 1
    return {
        "instructions": total,
        "fma": {kind: fma.get(kind, 0) for kind in ("zmm", "ymm", "xmm", "scalar")},
        "dot_products": dict(sorted(dots.items())),
        "widest_vector_bits": widest,
    }


_WIDTH = {"zmm": 512, "ymm": 256, "xmm": 128}
_NAME = {512: "zmm", 256: "ymm", 128: "xmm", 0: "scalar"}
