"""Schedule spaces: which MetaSchedule rules, postprocessors and mutators explore a task, per target.

A space is a function ``(target) -> SpaceGenerator``, registered by name. The tuner asks for the space of
a target with :func:`space_for` and never builds rules itself, so a new space (a different tiling
structure, a polyhedral-guided generator...) plugs in here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln_tvm import Target, ms

SpaceFactory = Callable[[Target], Any]

_SPACES: dict[str, SpaceFactory] = {}


def register_space(name: str) -> Callable[[SpaceFactory], SpaceFactory]:
    """Register a schedule space under ``name``."""

    def wrap(factory: SpaceFactory) -> SpaceFactory:
        _SPACES[name] = factory
        return factory

    return wrap


def available_spaces() -> list[str]:
    """Names of the registered spaces."""
    return sorted(_SPACES)


@register_space("cpu")
def cpu_space(target: Target) -> Any:
    """Multi-level tiling (SSRSRS) with a write cache, parallel/vectorize/unroll, inlining, rfactor.

    TVM's own LLVM defaults, minus the VNNI tensorization rule: on fp32 it never applies and on
    int8 every candidate failed to build with TVM 0.27 (see TVM_NOTES.md).
    """
    rules = [
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
        ms.schedule_rule.MultiLevelTiling(
            structure="SSRSRS",
            tile_binds=None,
            max_innermost_factor=64,
            vector_load_lens=None,
            reuse_read=None,
            reuse_write=ms.schedule_rule.ReuseType(req="may", levels=[1, 2], scope="global"),
        ),
        ms.schedule_rule.ParallelizeVectorizeUnroll(
            max_jobs_per_core=16,
            max_vectorize_extent=64,
            unroll_max_steps=[0, 16, 64, 512],
            unroll_explicit=True,
        ),
        ms.schedule_rule.RandomComputeLocation(),
    ]
    postprocs = [
        ms.postproc.DisallowDynamicLoop(),
        ms.postproc.RewriteParallelVectorizeUnroll(),
        ms.postproc.RewriteReductionBlock(),
        ms.postproc.RewriteLayout(),
    ]
    mutators = {
        ms.mutator.MutateTileSize(): 0.9,
        ms.mutator.MutateComputeLocation(): 0.05,
        ms.mutator.MutateUnroll(): 0.03,
        ms.mutator.MutateParallel(max_jobs_per_core=16): 0.02,
    }
    return ms.space_generator.PostOrderApply(sch_rules=rules, postprocs=postprocs, mutator_probs=mutators)


@register_space("gpu")
def gpu_space(target: Target) -> Any:
    """TVM's default CUDA space (thread binding, shared-memory tiling, cooperative fetch)."""
    return ms.space_generator.PostOrderApply(
        sch_rules="from-target", postprocs="from-target", mutator_probs="from-target"
    )


def default_space_name(target: Target) -> str:
    """The space Kiln uses for a target when the user names none."""
    return "gpu" if "gpu" in [str(k) for k in target.keys] else "cpu"


def space_for(target: Target, name: str | None = None) -> Any:
    """A fresh space generator for ``target`` (one per task: generators hold per-task state)."""
    name = name or default_space_name(target)
    try:
        factory = _SPACES[name]
    except KeyError:
        raise ValueError(f"unknown schedule space {name!r}; known: {', '.join(available_spaces())}") from None
    return factory(target)
