"""Limits of the bounded processes that import models and run jobs."""

from __future__ import annotations

from pydantic import BaseModel, Field


class LimitSettings(BaseModel):
    """Limits of the bounded processes that import models and run jobs."""

    import_memory_mb: int = Field(
        default=3072, ge=64, description="Memory one model import or preview may allocate, in MiB"
    )
    import_timeout_s: float = Field(
        default=120.0, gt=0, description="Wall-clock limit of one model import or preview, in seconds"
    )
    import_cpu_s: float | None = Field(
        default=None, gt=0, description="CPU-time limit of one import or preview; default: the timeout"
    )
    import_concurrency: int = Field(
        default=2, ge=1, description="Model imports and previews run at once; more wait for a slot"
    )
    import_warm_processes: int = Field(
        default=1,
        ge=0,
        le=8,
        description="> 0: start the importers' fork server (TVM loaded) with the service, not at the first upload",
    )
    job_memory_mb: int = Field(
        default=12288,
        ge=256,
        description="Memory one job's processes (tuning, builders, runners, timing) may hold together, in MiB",
    )
    job_stage_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="Wall-clock limit of each stage of a job after tuning (compiling, verifying, measuring, "
        "profiling, packaging), and how far tuning may run past the job's time budget, in seconds",
    )
    job_tuning_timeout_s: float = Field(
        default=86400.0, gt=0, description="Wall-clock limit of the tuning of a job that has no time budget"
    )
    max_unpacked_mb: int = Field(
        default=4096, ge=1, description="Largest total uncompressed size of a .pt2 archive's members, in MiB"
    )
    max_calibration_mb: int = Field(
        default=1024,
        ge=1,
        description="Largest calibration file (.npz of a model's inputs) accepted, packed or unpacked, in MiB",
    )
