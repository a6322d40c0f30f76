"""The options of ``torch.compile(model, backend="kiln", options={...})``, their defaults from ``KILN_*``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import InvalidSpec
from tuner.settings import Settings

#: Option name -> what it does (the error for an unknown option lists them).
OPTIONS = {
    "freeze": "bind parameters and buffers as constants (weights pre-packed; later changes to them unseen)",
    "tune": "'off', 'queue' (queue a tuning job for each graph with untuned kernels) or a number of trials",
    "target": "'host' or a target JSON object (dict)",
    "trials": "with tune='queue': the queued job's trials (default: 64 per kernel without a record)",
    "time_budget_s": "with tune: also stop tuning after this many seconds",
    "dynamic": "compile with symbolic sizes (untuned); default: what torch.compile's dynamic= captured",
    "data_dir": "Kiln's data directory (KILN_DATA_DIR): where its store and models live",
    "database_url": "Kiln's database (KILN_DATABASE_URL)",
    "owner": "whose tuning records apply, and who owns queued jobs (default: '', the CLI's)",
    "name": "the name captured graphs are stored under (default: 'captured')",
    "strict": "raise instead of running a graph eagerly when Kiln cannot compile it",
}


@dataclass(frozen=True)
class CaptureOptions:
    """What the backend does with each captured graph."""

    settings: Settings
    freeze: bool
    tune: int | str  # "off", "queue" or a number of trials (> 0)
    trials: int | None  # a queued job's trials (None: per kernel without a record)
    target: str | dict[str, Any]
    time_budget_s: float | None
    dynamic: bool | None
    owner: str
    name: str
    strict: bool


def capture_options(options: Mapping[str, Any] | None, settings: Settings | None = None) -> CaptureOptions:
    """Options given to ``torch.compile`` over the ``KILN_*`` settings; an unknown or ill-typed option is an
    :class:`InvalidSpec` that lists the known ones."""
    given = dict(options or {})
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        known = "; ".join(f"{k}: {v}" for k, v in OPTIONS.items())
        raise InvalidSpec(f"unknown torch.compile option(s) {unknown} for backend 'kiln'; it takes {known}")
    overrides = {k: given[k] for k in ("data_dir", "database_url") if given.get(k) is not None}
    if "data_dir" in overrides:
        overrides["data_dir"] = Path(overrides["data_dir"])
    base = settings or Settings()
    settings = base.model_copy(update=overrides) if overrides else base
    return CaptureOptions(
        settings=settings,
        freeze=_bool(given, "freeze", settings.capture_freeze),
        tune=_tune(given.get("tune", settings.capture_tune)),
        target=_target(given.get("target", settings.capture_target)),
        trials=_trials(given.get("trials")),
        time_budget_s=_positive(given.get("time_budget_s"), "time_budget_s"),
        dynamic=_bool(given, "dynamic", None),
        owner=str(given.get("owner", "")),
        name=str(given.get("name", "captured")),
        strict=bool(_bool(given, "strict", False)),
    )


def _bool(given: Mapping[str, Any], key: str, default: bool | None) -> Any:
    value = given.get(key, default)
    if value is not None and not isinstance(value, bool):
        raise InvalidSpec(f"option '{key}' must be True or False, got {value!r}")
    return value


def _tune(value: Any) -> int | str:
    if isinstance(value, bool):
        raise InvalidSpec(f"option 'tune' must be 'off', 'queue' or a number of trials, got {value!r}")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int):
        if value < 0:
            raise InvalidSpec(f"option 'tune' must be a positive number of trials, got {value}")
        return value if value > 0 else "off"
    if value in ("off", "queue", None):
        return value or "off"
    raise InvalidSpec(f"option 'tune' must be 'off', 'queue' or a number of trials, got {value!r}")


def _trials(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSpec(f"option 'trials' must be a positive number of trials, got {value!r}")
    return value


def _target(value: Any) -> str | dict[str, Any]:
    if isinstance(value, str | dict):
        return value
    raise InvalidSpec(f"option 'target' must be 'host' or a target JSON object, got {type(value).__name__}")


def _positive(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidSpec(f"option '{key}' must be a positive number of seconds, got {value!r}")
    return float(value)
