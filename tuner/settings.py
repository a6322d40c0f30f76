"""Kiln's configuration: ``KILN_*`` environment variables, overridable by CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Settings shared by the CLI, the workers and the web service."""

    model_config = SettingsConfigDict(env_prefix="KILN_", extra="ignore")

    data_dir: Path = Field(default=Path("kiln-data"), description="Where models, artifacts and SQLite live")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: SQLite file kiln.db in data_dir"
    )
    num_trials_per_iter: int = Field(default=16, ge=1, description="Candidates measured per search round")
    measure_number: int = Field(default=1, ge=1, description="Least runs per measurement repeat")
    measure_repeat: int = Field(default=3, ge=1, description="Measurement repeats per candidate")
    measure_min_repeat_ms: int = Field(
        default=10, ge=0, description="Time of one repeat (runs per repeat calibrated to fill it)"
    )
    latency_rounds: int = Field(
        default=3, ge=1, le=20, description="Interleaved rounds of the end-to-end side-by-side timing"
    )
    profile_budget_s: float = Field(
        default=2.0,
        ge=0,
        le=60,
        description="Seconds of profiled runs of the tuned model (and of onnxruntime) per job; 0: no profile",
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
    weight_prepack: bool = Field(
        default=True, description="CPU: let tuned kernels choose the weights' layout"
    )
    cpu_conv_layout: Literal["NHWC", "NCHW"] = Field(
        default="NHWC", description="CPU: layout convolutions are converted to before tuning"
    )
    fast_math: bool = Field(
        default=True,
        description="CPU: exp, erf, tanh and softmax use TVM's vectorisable approximations",
    )
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
    verify_rtol: float = Field(default=1e-3, gt=0, description="Relative tolerance of artifact checks")
    verify_atol: float = Field(default=1e-4, gt=0, description="Absolute tolerance of artifact checks")

    # The service and its workers.
    host: str = Field(default="127.0.0.1", description="Address `kiln serve` binds to")
    port: int = Field(default=8000, ge=0, le=65535, description="Port `kiln serve` listens on")
    embedded_workers: int = Field(
        default=1, ge=0, description="Workers inside the server process (0: only standalone `kiln worker`s)"
    )
    max_upload_mb: int = Field(default=512, ge=1, description="Largest model upload accepted, in MiB")
    max_streams_per_user: int = Field(
        default=20, ge=1, description="Job event streams (Server-Sent Events) one user may hold open at once"
    )
    max_json_kb: int = Field(
        default=1024,
        ge=1,
        description="Largest body of any other request (JSON: a job, a token...), in KiB; refused before parsing",
    )
    api_tokens: str | None = Field(
        default=None,
        description="Comma-separated bearer tokens, each `name:token` (or a bare token); enables auth",
    )
    insecure: bool = Field(
        default=False, description="Allow binding to a non-loopback address without any API token"
    )
    auth: Literal["required", "off"] | None = Field(
        default=None,
        description=(
            "Whether every /api request needs a token, decided once at start-up; default: required when "
            "any token is configured or the server binds beyond loopback, else off"
        ),
    )
    share_records: bool = Field(
        default=False,
        description=(
            "Let every user's jobs start from every other user's tuning records (faster tuning, but it "
            "reveals which kernel shapes others tuned); default: each owner sees only their own records"
        ),
    )

    # Model handling (import, task preview, graph view) runs in bounded child processes.
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
    heartbeat_s: float = Field(default=5.0, gt=0, description="How often a worker heartbeats its job")
    stale_after_s: float = Field(
        default=60.0, gt=0, description="A running job whose heartbeat is older than this is requeued"
    )
    max_attempts: int = Field(default=3, ge=1, description="Runs of a job before it fails for good")
    poll_interval_s: float = Field(default=1.0, gt=0, description="How often an idle worker looks for jobs")
    cancel_grace_s: float = Field(
        default=5.0, ge=0, description="How long a cancelled job may take to stop before it is killed"
    )
    rpc_tracker: str | None = Field(
        default=None, description="host:port of the TVM RPC tracker shown on /api/v1/devices"
    )
    rpc_trackers: str | None = Field(
        default=None,
        description="More host:port trackers that jobs submitted over the API may use, comma-separated "
        "(besides KILN_RPC_TRACKER); a job's tracker must be one of them",
    )
    rpc_timeout_s: float = Field(default=10.0, gt=0, description="Connect timeout to the RPC tracker")

    # torch.compile(backend="kiln"): the defaults of its options (torch.compile's options= override them).
    capture_tune: str = Field(
        default="off",
        pattern=r"^(off|queue|[0-9]+)$",
        description=(
            "What the torch.compile backend does with kernels that have no tuned record: off (report them), "
            "queue (queue a tuning job for the captured graph) or a number of trials to tune in-process"
        ),
    )
    capture_freeze: bool = Field(
        default=False,
        description="torch.compile backend: bind parameters as constants (weights pre-packed; later changes unseen)",
    )
    capture_target: str = Field(
        default="host", description="torch.compile backend: the target ('host' or a target JSON object)"
    )
    capture_poll_s: float = Field(
        default=5.0, gt=0, description="torch.compile backend: how often a graph looks at its queued job"
    )

    @field_validator("cache_sizes", "rpc_cache_sizes")
    @classmethod
    def _readable_cache_sizes(cls, value: str | None) -> str | None:
        if value:
            from schedules.poly.caches import parse_cache_spec

            parse_cache_spec(value)  # raises ValueError, which pydantic reports with the setting's name
        return value

    def allowed_rpc_trackers(self) -> list[str]:
        """The trackers jobs submitted over the API may measure through: KILN_RPC_TRACKER first, then
        KILN_RPC_TRACKERS."""
        named = [self.rpc_tracker or "", *(self.rpc_trackers or "").split(",")]
        return list(dict.fromkeys(t.strip() for t in named if t.strip()))

    def record_scope(self, owner: str) -> str | None:
        """Whose tuning records a job of ``owner`` reads and shows: its owner's, or all (KILN_SHARE_RECORDS)."""
        return None if self.share_records else owner

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'kiln.db').resolve()}"

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"
