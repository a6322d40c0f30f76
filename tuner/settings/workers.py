"""How workers claim, heartbeat, retry and cancel jobs, and reach RPC devices."""

from __future__ import annotations

from pydantic import BaseModel, Field


class WorkerSettings(BaseModel):
    """How workers claim, heartbeat, retry and cancel jobs, and reach RPC devices."""

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
    rpc_servers_per_job: int = Field(
        default=8,
        ge=1,
        description="How many RPC servers of its key one job measures on at once (as many as the key has, "
        "up to this; one candidate per server)",
    )

    def allowed_rpc_trackers(self) -> list[str]:
        """The trackers jobs submitted over the API may measure through: KILN_RPC_TRACKER first, then
        KILN_RPC_TRACKERS."""
        named = [self.rpc_tracker or "", *(self.rpc_trackers or "").split(",")]
        return list(dict.fromkeys(t.strip() for t in named if t.strip()))
