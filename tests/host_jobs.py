"""The pipeline most integration tests drive: register a model file, submit a job for this CPU, run it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.entities import JobSpec
from tuner.jobs.pipeline import JobResult, run_job
from tuner.jobs.recorder import JobListener
from tuner.jobs.submission import submit_job
from tuner.model_registry import register_model
from tuner.settings import Settings
from tuner.store import Store
from tuner.targets import host_target


def run_host_job(
    store: Store,
    settings: Settings,
    path: Path,
    *,
    listener: JobListener | None = None,
    **spec: Any,
) -> JobResult:
    """Register the model at ``path`` in ``store``, submit a job for this CPU (``spec``: the job's other
    :class:`JobSpec` fields, ``trials`` first among them) and run it in this process, as a worker would."""
    model, _ = register_model(store, settings, path)
    job = submit_job(store, JobSpec(model_id=model.id, target=host_target(), **spec))
    return run_job(store, settings, job.id, listener=listener)
