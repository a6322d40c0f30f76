"""The service itself: liveness, and the RPC devices it can measure on."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from service.schemas.common import EntityOut


class ServerUseOut(EntityOut):
    server: str = Field(description="host:port of the RPC server (as Kiln's server names itself)")
    job_id: str | None = Field(description="the running job measuring on it; null: another user's job")
    candidates: int = Field(description="how many of the job's candidates it has measured")
    last_used_at: datetime


class DeviceOut(EntityOut):
    key: str
    free: int
    pending: int
    total: int
    in_use: list[ServerUseOut] = Field(
        default_factory=list,
        description="the running jobs measuring on this key's servers, by server, the latest first",
    )


class DevicesOut(BaseModel):
    tracker: str | None
    devices: list[DeviceOut]
    message: str | None = None
    host_bf16: list[str] = Field(
        default_factory=list,
        description="The bf16 instructions of the server's CPU as LLVM names them (amx-bf16, avx512bf16): "
        "where it has any, the dashboard proposes the 'auto' precision",
    )


class HealthOut(BaseModel):
    status: Literal["ok"]
    database: str
    schema_revision: str | None
    embedded_workers: int
    auth: bool
