"""The service itself: liveness, and the RPC devices it can measure on."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

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


class HealthOut(BaseModel):
    status: Literal["ok"]
    database: str
    schema_revision: str | None
    embedded_workers: int
    auth: bool
