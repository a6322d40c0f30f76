"""Kiln's configuration: ``KILN_*`` environment variables, overridable by CLI flags.

One :class:`Settings` holds them all, composed of one class per concern (each in its own module), so
that the variables keep their flat ``KILN_<FIELD>`` names.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

from tuner.settings.capture import CaptureSettings
from tuner.settings.limits import LimitSettings
from tuner.settings.planning import PlanningSettings
from tuner.settings.reports import ReportSettings
from tuner.settings.search import SearchSettings
from tuner.settings.service import ServiceSettings
from tuner.settings.storage import StorageSettings
from tuner.settings.workers import WorkerSettings


class Settings(
    StorageSettings,
    PlanningSettings,
    SearchSettings,
    ReportSettings,
    ServiceSettings,
    LimitSettings,
    WorkerSettings,
    CaptureSettings,
    BaseSettings,
):
    """Settings shared by the CLI, the workers and the web service."""

    model_config = SettingsConfigDict(env_prefix="KILN_", extra="ignore")


__all__ = ["Settings"]
