"""``torch.compile(model, backend="kiln")``: the TorchDynamo backend, registered through the
``torch_dynamo_backends`` entry point (``pyproject.toml``), so no import is needed.

Each graph Dynamo captures is exported (:mod:`tuner.capture.graph`), imported into Relax as a .pt2 file
would be, planned by Kiln's graph passes and compiled with the best record of each kernel in Kiln's store
for the target (:mod:`tuner.capture.compiled`). Kernels without a record are reported, and with the
``tune`` option queued or tuned as a job. A graph Kiln cannot compile (an operator TVM lacks, tensors on
another device, autograd on) runs eagerly, with the reason logged: the user's program never fails
because of the backend, unless ``strict`` asks for the error.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.capture.options import CaptureOptions, capture_options
from tuner.errors import KilnError

log = logging.getLogger("kiln.capture")

_graph_numbers = itertools.count()
_compiled: weakref.WeakSet[Any] = weakref.WeakSet()
_stores: dict[str, Any] = {}
_stores_lock = threading.Lock()


def kiln_backend(
    gm: Any, example_inputs: Sequence[Any], options: Mapping[str, Any] | None = None, mode: str | None = None
) -> Any:
    """Compile one captured graph with Kiln, or return it to run eagerly with the reason logged."""
    del mode  # torch.compile's modes are inductor's
    opts = capture_options(options)  # a misspelt option is the user's error: raised, not swallowed
    name = f"{opts.name}-{next(_graph_numbers)}"
    try:
        compiled = compile_captured(gm, example_inputs, opts, name)
    except Exception as exc:
        if opts.strict:
            raise
        log.warning("kiln: %s runs eagerly: %s", name, _reason(exc))
        return gm.forward
    _compiled.add(compiled)
    return compiled


def compiled_graphs() -> list[Any]:
    """The graphs this process compiled with Kiln that are still in use (their ``report`` says what each
    kernel got), oldest first."""
    return sorted(_compiled, key=lambda c: int(c.report.name.rsplit("-", 1)[-1]))


def compile_captured(gm: Any, example_inputs: Sequence[Any], opts: CaptureOptions, name: str) -> Any:
    """A :class:`~tuner.capture.compiled.CompiledGraph` of the captured graph, its misses handled as the
    ``tune`` option says; raises :class:`~tuner.capture.graph.NotCapturable` (or a Kiln error) when the
    graph cannot be compiled."""
    import torch

    from tuner.capture.compiled import CompiledGraph
    from tuner.capture.graph import Feed, NotCapturable, describe_placeholders, export_captured

    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    devices = sorted({x.device.type for x in tensors} - {"cpu"})
    if devices:
        raise NotCapturable(f"its tensors are on {', '.join(devices)}; Kiln's backend compiles for the CPU")
    if torch.is_grad_enabled() and any(x.requires_grad for x in tensors):
        raise NotCapturable(
            "autograd is on and the graph has tensors that require grad; Kiln compiles inference graphs: "
            "call the model under torch.no_grad() or torch.inference_mode()"
        )
    placeholders = describe_placeholders(gm, example_inputs)
    dynamic = any(p.feed is Feed.SIZE for p in placeholders)
    exported = export_captured(gm, example_inputs, placeholders, opts.freeze, dynamic)
    compiled = CompiledGraph(exported, opts, lambda: _store(opts), name, gm.forward)
    report = compiled.report
    if dynamic:
        log.warning(
            "kiln: %s has symbolic shapes: compiled untuned (tuning is per static shape; "
            "torch.compile(..., dynamic=False) compiles, and tunes, each shape)",
            name,
        )
        return compiled
    if report.untuned and opts.tune != "off":
        _tune_misses(compiled, exported, opts, name)
    elif report.untuned:
        log.warning(
            "kiln: %s: %d of %d kernels have no tuned record for %s and use schedules built without "
            "measuring (%s); options={'tune': 'queue'} queues a tuning job, {'tune': N} tunes N trials now",
            name,
            len(report.untuned),
            len(report.kernels),
            report.target_key,
            ", ".join(sorted({k.source.value for k in report.untuned})),
        )
    log.info("kiln: %s", report.summary())
    return compiled


def _tune_misses(compiled: Any, exported: Any, opts: CaptureOptions, name: str) -> None:
    from tuner.capture.store_and_tune import TRIALS_PER_UNTUNED_KERNEL, queue_tuning, tune_now

    store = _store(opts)
    if opts.tune == "queue":
        trials = opts.trials or TRIALS_PER_UNTUNED_KERNEL * len(compiled.report.untuned)
        job = queue_tuning(store, exported, opts, name=name, target=compiled.target, trials=trials)
        compiled.wait_for_job(job.id)
        log.warning(
            "kiln: %s: %d kernels untuned; queued tuning job %s (%d trials): a worker (kiln serve, kiln worker) "
            "runs it, and this graph is rebuilt with its records when it has finished",
            name,
            len(compiled.report.untuned),
            job.id,
            trials,
        )
        return
    trials = int(opts.tune)
    log.warning(
        "kiln: %s: tuning %d trials now for %d untuned kernels", name, trials, len(compiled.report.untuned)
    )
    job = tune_now(store, exported, opts, name=name, target=compiled.target, trials=trials)
    compiled.report.job_id = job.id
    compiled.rebuild()
    log.warning("kiln: %s: job %s %s; %s", name, job.id, job.status.value, compiled.report.summary())


def _store(opts: CaptureOptions) -> Any:
    """One store per database in this process, its schema created or checked."""
    from tuner.store.sql import Store

    url = opts.settings.resolved_database_url
    with _stores_lock:
        if url not in _stores:
            store = Store.from_settings(opts.settings)
            store.ensure_schema(auto_create=True)
            _stores[url] = store
        return _stores[url]


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KilnError):
        return exc.message
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
