"""The REST service: where it listens, what it accepts, who may call it, whose records a job sees."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ServiceSettings(BaseModel):
    """The REST service: where it listens, what it accepts, who may call it, whose records a job sees."""

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

    def record_scope(self, owner: str) -> str | None:
        """Whose tuning records a job of ``owner`` reads and shows: its owner's, or all (KILN_SHARE_RECORDS)."""
        return None if self.share_records else owner
