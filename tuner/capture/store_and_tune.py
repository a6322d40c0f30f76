"""Tuning a captured graph: keep it as a .pt2 model in Kiln's store and queue (or run) a job for it, the
same job the CLI or the REST API would run on that file, so its records apply to the graph next time."""

from __future__ import annotations

import hashlib
import logging
import tempfile
from pathlib import Path

from tuner.capture.graph import ExportedCapture
from tuner.capture.options import CaptureOptions
from tuner.entities import Job, JobSpec
from tuner.jobs.pipeline import run_job
from tuner.jobs.submission import submit_job
from tuner.model_registry import register_model
from tuner.store.sql import Store

log = logging.getLogger("kiln.capture")

#: Trials per kernel without a record that a queued job gets when the options name no budget.
TRIALS_PER_UNTUNED_KERNEL = 64


def store_capture(store: Store, exported: ExportedCapture, options: CaptureOptions, name: str) -> str:
    """Register the captured program as a model (imported in the sandbox, like an upload); its id."""
    import torch

    with tempfile.TemporaryDirectory(prefix="kiln-capture-") as tmp:
        path = Path(tmp) / f"{name}.pt2"
        torch.export.save(exported.program, str(path))
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:8]
        model, new = register_model(
            store, options.settings, path, name=f"{name}-{digest}", owner=options.owner
        )
    log.info("kiln: captured graph %s stored as model %s%s", name, model.id, "" if new else " (seen before)")
    return model.id


def queue_tuning(
    store: Store, exported: ExportedCapture, options: CaptureOptions, *, name: str, target: dict, trials: int
) -> Job:
    """Queue a tuning job of ``trials`` for the captured graph (a worker runs it: ``kiln serve``/``kiln worker``)."""
    model_id = store_capture(store, exported, options, name)
    spec = JobSpec(model_id=model_id, target=target, trials=trials, time_budget_s=options.time_budget_s)
    return submit_job(store, spec, options.owner)


def tune_now(
    store: Store, exported: ExportedCapture, options: CaptureOptions, *, name: str, target: dict, trials: int
) -> Job:
    """Queue the job and run it in this process to its end (:func:`tuner.jobs.pipeline.run_job`)."""
    job = queue_tuning(store, exported, options, name=name, target=target, trials=trials)
    return run_job(store, options.settings, job.id).job
