"""What the schedule rules ask of loops and of the target: a loop's constant extent, and how many fp32
lanes the target's vectors hold."""

from __future__ import annotations

from typing import Any

from kiln_tvm import Target, s_tir, tvm
from schedules.isa import isa_profile


def loop_extent(sch: s_tir.Schedule, loop: Any) -> int | None:
    """The extent of ``loop`` when it is a constant (None when symbolic)."""
    extent = sch.get(loop).extent
    return int(extent) if isinstance(extent, tvm.tirx.IntImm) else None


def fp32_lanes(target: Target) -> int:
    """fp32 lanes of the widest vector registers ``target``'s CPU has: 16 with AVX-512, 8 with AVX, else 4
    (SSE, NEON). Read from the target's own CPU features (:mod:`schedules.isa`): LLVM's
    ``llvm_get_vector_width`` answers 512 for ``znver3``, which has no AVX-512."""
    return isa_profile(target).fp32_lanes
