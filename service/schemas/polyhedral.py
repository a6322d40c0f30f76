"""The response of the polyhedral routes: a task's loop nest as isl sees it, what its dependences allow,
and its tiles against the caches (built by :func:`tuner.views.inspection.task_polyhedral`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PolyLoopOut(BaseModel):
    name: str
    extent: int
    kind: str = Field(description="spatial, reduction or mixed (from the block variables it binds)")


class PolyStatementOut(BaseModel):
    name: str = Field(description="The TIR block")
    isl_name: str = Field(description="Its tuple name in the isl sets and maps")
    loops: list[PolyLoopOut]
    dependence_summary: str = Field(description="What carries its dependences on itself, in a sentence")
    exact: bool


class PolyAccessOut(BaseModel):
    statement: str
    tensor: str
    kind: str = Field(description="read or write")
    shape: list[int]
    relation: str = Field(description="The access relation in isl notation, within the tensor's bounds")
    exact: bool = Field(description="False: the index is not affine and the relation is its bounding box")
    clamped: bool = Field(description="The affine index reaches outside the tensor (padding) and is clamped")
    reason: str | None
    reuse: list[list[int]] = Field(description="Loop directions along which the same element is touched")


class PolyDependenceOut(BaseModel):
    kind: str = Field(description="RAW, WAR or WAW (memory-based)")
    source: str
    sink: str
    tensor: str
    common_loops: list[str]
    distance: str | None = Field(description="Per common loop, the range of sink minus source")
    carried_by: list[str] = Field(description="The common loops that carry it; empty: only textual order")
    relation: str


class PolyLoopLegalityOut(BaseModel):
    statement: str
    loop: str
    extent: int
    kind: str
    parallel: bool
    band: int = Field(description="Index of its permutable band (tiling and interchange legal within one)")
    permutable: bool
    reduction: bool = Field(description="Carries only an accumulation: parallel through rfactor")
    vectorizable: bool
    carries: list[str]


class PolyFusionOut(BaseModel):
    producer: str
    consumer: str
    tensor: str
    depth: int = Field(description="The deepest legal compute_at of the producer into the consumer")
    shared_loops: list[str]


class CacheLevelOut(BaseModel):
    name: str
    level: int
    bytes: int


class CachesOut(BaseModel):
    source: str = Field(description="sysfs, settings, rpc device or unknown (unknown: no pruning)")
    levels: list[CacheLevelOut]


class TileCutOut(BaseModel):
    cut: str = Field(description="Position in the tiling structure: one iteration of this loop level")
    tile: list[int] = Field(description="Iterations of each loop in one such tile")
    bytes: dict[str, int] = Field(description="Footprint per tensor")
    total_bytes: int
    cache_level: str | None = Field(description="The level the cpu-poly pruner holds this cut against")
    cache_bytes: int | None


class BestTilingOut(BaseModel):
    statement: str
    structure: str
    loops: list[str]
    factors: list[list[int]] = Field(description="Per loop, its tile factors, outermost first")
    cuts: list[TileCutOut]
    inside_feasible_set: bool | None = Field(
        description="Whether the pruner would keep it (null: cache sizes unknown)"
    )
    overflows: list[str]


class BestScheduleTilesOut(BaseModel):
    latency_us: float | None
    tilings: list[BestTilingOut]
    note: str | None


class SearchStatsOut(BaseModel):
    space: str | None = Field(description="The space that tuned the job")
    examined: int | None = None
    rejected: int | None = None
    passed_through: int | None = Field(default=None, description="Rejected by the model, searched anyway")
    seeds: int | None = Field(default=None, description="Seed schedules measured before the search")
    caches: str | None = Field(default=None, description="The cache sizes the hooks used, as a spec")
    cache_source: str | None = Field(default=None, description="Where those sizes came from")


class PolyhedralOut(BaseModel):
    exact: bool = Field(description="Every access is affine: the model is exact")
    inexact: list[str] = Field(description="What could not be modelled exactly, and how it was kept")
    fallback: str | None
    domain: str = Field(description="The iteration domains in isl notation")
    statements: list[PolyStatementOut]
    accesses: list[PolyAccessOut]
    dependences: list[PolyDependenceOut]
    loops: list[PolyLoopLegalityOut]
    fusion: list[PolyFusionOut]
    caches: CachesOut
    best_schedule: BestScheduleTilesOut | None = Field(description="Null for a model's untuned task")
    search: SearchStatsOut | None = Field(description="Null for a model's untuned task")
