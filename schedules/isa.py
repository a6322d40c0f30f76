"""One resolved ISA profile of a target: what its CPU's vector units can do, read from LLVM once.

Every ISA decision in the schedules (register tiles, integer and bf16 dot products, AMX tiles) reads this
profile instead of asking LLVM for the feature list again, so that a target means the same CPU to all of
them and a new feature is added in one place.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from kiln_tvm import Target, tvm


@dataclass(frozen=True)
class IsaProfile:
    """The vector features of one CPU target (empty for a target that is not a CPU LLVM knows)."""

    features: frozenset[str]

    def has(self, *names: str) -> bool:
        """Whether the CPU has every one of ``names`` (LLVM's spelling: ``avx512f``, ``amx-int8``)."""
        return set(names) <= self.features

    @property
    def fp32_lanes(self) -> int:
        """fp32 lanes of the widest vector registers: 16 with AVX-512, 8 with AVX, else 4 (SSE, NEON)."""
        if self.has("avx512f"):
            return 16
        if self.has("avx"):
            return 8
        return 4

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers of that width: 32 with AVX-512 (and on AArch64), else 16."""
        return 32 if self.has("avx512f") or self.has("neon") else 16

    @property
    def fma(self) -> bool:
        """Whether a multiply-add is one instruction (FMA3 on x86, always on AArch64)."""
        return self.has("fma") or self.has("neon")

    @property
    def avx512_bf16(self) -> bool:
        """AVX512-BF16's ``vdpbf16ps`` (Intel since Cooper Lake, AMD since Zen 4)."""
        return self.has("avx512bf16")

    @property
    def amx_int8(self) -> bool:
        """AMX tiles with the int8 multiply (Intel Xeon since Sapphire Rapids)."""
        return self.has("amx-tile", "amx-int8")

    @property
    def amx_bf16(self) -> bool:
        """AMX tiles with the bf16 multiply (Intel Xeon since Sapphire Rapids)."""
        return self.has("amx-tile", "amx-bf16")


NO_CPU = IsaProfile(frozenset())


def isa_profile(target: Target) -> IsaProfile:
    """The profile of ``target``'s CPU (:data:`NO_CPU` for a target that is not ``llvm``)."""
    if target.kind.name != "llvm":
        return NO_CPU
    return _profile_of(json.dumps(_cpu_attrs(target), sort_keys=True, default=str))


def _cpu_attrs(target: Target) -> dict[str, object]:
    attrs = {"kind": "llvm"}
    for key in ("mtriple", "mcpu", "mattr"):
        value = target.attrs.get(key)
        if value is not None and str(value):
            attrs[key] = [str(v) for v in value] if key == "mattr" else str(value)
    return attrs


# LLVM's answer holds the interpreter for milliseconds; a process plans for few targets: asked once each.
@functools.lru_cache(maxsize=64)
def _profile_of(target_json: str) -> IsaProfile:
    features = tvm.target.codegen.llvm_get_cpu_features(Target(json.loads(target_json)))
    return IsaProfile(frozenset(str(f) for f in features))
