"""How tuning measures candidates and searches schedules (MetaSchedule, the cpu-poly space)."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator


class SearchSettings(BaseModel):
    """How tuning measures candidates and searches schedules (MetaSchedule, the cpu-poly space)."""

    num_trials_per_iter: int = Field(default=16, ge=1, description="Candidates measured per search round")
    measure_number: int = Field(default=1, ge=1, description="Least runs per measurement repeat")
    measure_repeat: int = Field(default=3, ge=1, description="Measurement repeats per candidate")
    measure_min_repeat_ms: int = Field(
        default=10, ge=0, description="Time of one repeat (runs per repeat calibrated to fill it)"
    )
    search_population: int | None = Field(
        default=None,
        ge=16,
        description="Evolutionary search population per round; default: 4 per candidate measured (min 32)",
    )
    default_schedules: bool = Field(
        default=True,
        description="Measure rule-based schedules (softmax, layer norm, GEMV) before the search",
    )
    builder_workers: int | None = Field(default=None, description="Parallel builds; default: physical cores")
    cache_sizes: str | None = Field(
        default=None,
        description=(
            "Data caches the cpu-poly space holds tiles against, e.g. 'L1d=48K,L2=1M,L3=32M'; default: this "
            "machine's, from /sys/devices/system/cpu/cpu0/cache"
        ),
    )
    rpc_cache_sizes: str | None = Field(
        default=None,
        description="The same for devices measured over RPC; without it, cpu-poly does not prune for them",
    )
    poly_margin: float = Field(
        default=0.5, ge=0, description="cpu-poly: how far (0.5: 50 %) a tile may overflow its cache level"
    )
    poly_pass_through: float = Field(
        default=0.1, ge=0, le=1, description="cpu-poly: fraction of rejected candidates searched anyway"
    )
    poly_seeds: int = Field(
        default=4,
        ge=0,
        description="cpu-poly: tilings (best-ranked, one per register tile) measured per task first",
    )

    @field_validator("cache_sizes", "rpc_cache_sizes")
    @classmethod
    def _readable_cache_sizes(cls, value: str | None) -> str | None:
        if value:
            from schedules.poly.caches import parse_cache_spec

            parse_cache_spec(value)  # raises ValueError, which pydantic reports with the setting's name
        return value
