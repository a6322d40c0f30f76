"""The service itself: liveness, and the RPC devices it can measure on."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from service.schemas.common import EntityOut


class DeviceOut(EntityOut):
    key: str
    free: int
    pending: int
    total: int


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
