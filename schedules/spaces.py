"""Schedule spaces: which MetaSchedule rules, postprocessors and mutators explore a task, per target.

A space is a factory ``(target, options, stats) -> SpaceGenerator``, registered by name with the target
kinds it serves and whether the tuner seeds its search (``cpu-poly``: the polyhedral analysis' best-ranked
tilings, measured before the search). The tuner asks for a space with :func:`space_for` and never builds
rules itself, so a new space plugs in here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kiln_tvm import Target, ms
from schedules.amx import AmxTiling, amx_kinds
from schedules.poly.caches import UNKNOWN, CacheHierarchy
from schedules.poly.search import FootprintPruner, PruningStats
from schedules.vnni import (
    cpu_tiling_args,
    dpbf16_tiling,
    has_avx512_bf16,
    has_integer_dot,
    integer_dot,
    seven_bit_dot,
    vnni_tiling,
)

SpaceFactory = Callable[[Target, "SpaceOptions", PruningStats], Any]


@dataclass(frozen=True)
class SpaceOptions:
    """What a space may use beyond the target: the measuring device's caches (unknown: no cache-based
    pruning), how far a tile may overflow its cache before the candidate is rejected, the fraction of
    rejected candidates let through anyway, and how many seeds to measure per task."""

    caches: CacheHierarchy = UNKNOWN
    margin: float = 0.5
    pass_through: float = 0.1
    seeds: int = 4


@dataclass(frozen=True)
class Space:
    name: str
    factory: SpaceFactory
    target_kinds: tuple[str, ...]
    #: The tuner measures :func:`schedules.poly.search.seed_schedules` before searching this space.
    seeded: bool = False
    description: str = field(default="", compare=False)


_SPACES: dict[str, Space] = {}


def register_space(
    name: str, target_kinds: tuple[str, ...] = ("llvm",), seeded: bool = False
) -> Callable[[SpaceFactory], SpaceFactory]:
    """Register a schedule space under ``name`` for targets of ``target_kinds``."""

    def wrap(factory: SpaceFactory) -> SpaceFactory:
        doc = (factory.__doc__ or "").strip().splitlines()
        _SPACES[name] = Space(name, factory, target_kinds, seeded, doc[0] if doc else "")
        return factory

    return wrap


def available_spaces() -> list[str]:
    """Names of the registered spaces."""
    return sorted(_SPACES)


def get_space(name: str) -> Space:
    """The space registered as ``name`` (ValueError naming the known ones otherwise)."""
    try:
        return _SPACES[name]
    except KeyError:
        raise ValueError(f"unknown schedule space {name!r}; known: {', '.join(available_spaces())}") from None


def check_space(name: str, target_kind: str) -> None:
    """Refuse a space that does not exist or does not serve targets of ``target_kind``."""
    space = get_space(name)
    if target_kind not in space.target_kinds:
        raise ValueError(
            f"schedule space {name!r} is for {'/'.join(space.target_kinds)} targets, not {target_kind}; "
            f"use one of {', '.join(n for n in available_spaces() if target_kind in _SPACES[n].target_kinds)}"
        )


def _cpu_rules(target: Target) -> list[Any]:
    # The integer kernels packed for the CPU's dot product (VNNI's, else vpmaddwd's) are tensorized first
    # (schedules.vnni); on AMX CPUs, the packed matmuls AMX serves go on tiles before that (schedules.amx).
    # CPUs without VNNI have a second product for the kernels over 7-bit weights (vpmaddubsw).
    dots = [d for d in (integer_dot(target), seven_bit_dot(target)) if d is not None]
    vnni = [vnni_tiling(dot) for dot in dots]
    # The bf16 policy's packed matmuls that AMX does not take, on vdpbf16ps (schedules.vnni).
    dpbf16 = [dpbf16_tiling()] if has_avx512_bf16(target) else []
    kinds = tuple(kind.name for kind in amx_kinds(target))
    amx = [AmxTiling(kinds)] if kinds else []
    return [
        ms.schedule_rule.ApplyCustomRule(),
        ms.schedule_rule.InlineConstantScalars(),
        ms.schedule_rule.AutoInline(
            into_producer=False,
            into_consumer=True,
            inline_const_tensor=True,
            disallow_if_then_else=True,
            require_injective=True,
            require_ordered=True,
            disallow_op=["tirx.exp"],
        ),
        ms.schedule_rule.AddRFactor(max_jobs_per_core=16, max_innermost_factor=64),
        *amx,
        *vnni,
        *dpbf16,
        ms.schedule_rule.MultiLevelTiling(**cpu_tiling_args()),
        ms.schedule_rule.ParallelizeVectorizeUnroll(
            max_jobs_per_core=16,
            max_vectorize_extent=64,
            unroll_max_steps=[0, 16, 64, 512],
            unroll_explicit=True,
        ),
        ms.schedule_rule.RandomComputeLocation(),
    ]


def _cpu_postprocs(target: Target) -> list[Any]:
    # TVM's DefaultCPUTensorization postprocessors where a rule may tensorize.
    tensorize = (
        [ms.postproc.RewriteTensorize(vectorize_init_loop=True)]
        if has_integer_dot(target) or amx_kinds(target) or has_avx512_bf16(target)
        else []
    )
    return [
        ms.postproc.DisallowDynamicLoop(),
        ms.postproc.RewriteParallelVectorizeUnroll(),
        ms.postproc.RewriteReductionBlock(),
        *tensorize,
        ms.postproc.RewriteLayout(),
    ]


def _cpu_mutators() -> dict[Any, float]:
    return {
        ms.mutator.MutateTileSize(): 0.9,
        ms.mutator.MutateComputeLocation(): 0.05,
        ms.mutator.MutateUnroll(): 0.03,
        ms.mutator.MutateParallel(max_jobs_per_core=16): 0.02,
    }


@register_space("cpu")
def cpu_space(target: Target, options: SpaceOptions, stats: PruningStats) -> Any:
    """Multi-level tiling (SSRSRS) with a write cache, parallel/vectorize/unroll, inlining, rfactor.

    TVM's own x86 defaults, with its VNNI tensorization rule limited to the integer kernels whose
    weights Kiln packed for it (:mod:`schedules.vnni`), on CPUs that have VNNI.
    """
    return ms.space_generator.PostOrderApply(
        sch_rules=_cpu_rules(target), postprocs=_cpu_postprocs(target), mutator_probs=_cpu_mutators()
    )


@register_space("cpu-poly", seeded=True)
def cpu_poly_space(target: Target, options: SpaceOptions, stats: PruningStats) -> Any:
    """The ``cpu`` space shaped by the polyhedral analysis: candidates whose tiles overflow the caches are
    rejected (softly), and the search starts from the analysis' best-ranked tilings.

    The pruner runs first, so a rejected candidate costs no other postprocessing.
    """
    pruner = FootprintPruner(options.caches, options.margin, options.pass_through, stats)
    return ms.space_generator.PostOrderApply(
        sch_rules=_cpu_rules(target),
        postprocs=[pruner, *_cpu_postprocs(target)],
        mutator_probs=_cpu_mutators(),
    )


@register_space("gpu", target_kinds=("cuda",))
def gpu_space(target: Target, options: SpaceOptions, stats: PruningStats) -> Any:
    """TVM's default CUDA space (thread binding, shared-memory tiling, cooperative fetch)."""
    return ms.space_generator.PostOrderApply(
        sch_rules="from-target", postprocs="from-target", mutator_probs="from-target"
    )


def default_space_name(target: Target) -> str:
    """The space Kiln uses for a target when the user names none: ``cpu-poly`` on CPUs, which reached the
    stock space's 1,000-trial quality in 0.44x its trials on the geometric mean of the tiled kernels of
    ``bench/poly.py`` (bench/RESULTS.md, 2026-12-02, third run), ending within the noise of it."""
    return "gpu" if "gpu" in [str(k) for k in target.keys] else "cpu-poly"


def space_for(
    target: Target,
    name: str | None = None,
    options: SpaceOptions | None = None,
    stats: PruningStats | None = None,
) -> Any:
    """A fresh space generator for ``target`` (one per task: generators hold per-task state)."""
    space = get_space(name or default_space_name(target))
    return space.factory(target, options or SpaceOptions(), stats if stats is not None else PruningStats())
