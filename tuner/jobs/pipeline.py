"""Tuning jobs: check and queue one (:func:`submit_job`), and run one end to end: import, plan, tune,
compile, verify, measure, package (:func:`run_job`, :func:`execute_job`).

Every step writes its outcome to the store as it happens, through one :class:`~tuner.jobs.recorder.JobRecorder`,
so a job that dies midway leaves its measured records behind and the next run of the same model on the
same target starts from them. The artifact's manifest is built by :mod:`tuner.jobs.manifest`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schedules.amx import amx_kinds
from schedules.poly.caches import UNKNOWN, CacheHierarchy, host_caches, parse_cache_spec
from schedules.spaces import SpaceOptions, check_space, default_space_name, get_space
from tuner.compile import build_tuned, build_untuned, model_assembly, random_inputs
from tuner.entities import Artifact, FusionSummary, Job, JobSpec, JobStatus, MachineLimits, ModelInfo, Task
from tuner.errors import InvalidSpec, KilnError, MissingInputShape, TuningFailed
from tuner.frontend import ImportedModel, check_given_shape, load_model
from tuner.isolation.sandbox import SandboxLimits, file_bytes, is_out_of_memory, memory_limit
from tuner.jobs.artifact import export_library, pack_artifact
from tuner.jobs.failures import crash_report_path, describe_failure, write_crash_report
from tuner.jobs.guard import InProcessGuard, cli_worker_name
from tuner.jobs.manifest import job_manifest
from tuner.jobs.recorder import JobListener, JobRecorder
from tuner.metaschedule.cost_model import keep_cost_model, load_cost_model
from tuner.metaschedule.database import KilnDatabase
from tuner.model_registry import model_file
from tuner.passes.plan import GraphPlan, plan_graph
from tuner.passes.plan_keys import preview_refusal
from tuner.passes.precision import check_precision
from tuner.rpc.device_info import device_caches
from tuner.rpc.tracker import check_runner, validate_runner
from tuner.schedule_choice import choose_schedules
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.targets import canonical_target_key, check_runs_here, is_host_cpu, resolve_target, to_tvm_target
from tuner.timing.profile import host_limits, kernel_flops, profile_model
from tuner.timing.verify import (
    Comparison,
    FloatReference,
    Latencies,
    float_reference,
    measure_accuracy,
    measure_latencies,
    onnxruntime_model,
    verify_outputs,
    verify_reduced_precision,
)
from tuner.tune import Budget, MeasureConfig, check_cost_model, tune_tasks
from tuner.views.assembly import instruction_mix, kernel_assembly, split_functions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobResult:
    """What a finished job produced."""

    job: Job
    tasks: list[Task]
    fusion: FusionSummary
    artifact: Artifact | None
    comparisons: list[Comparison]
    latency: Latencies


def validate_spec(spec: JobSpec) -> dict[str, Any]:
    """The checks of a job spec that need no model: the target (and that the local runner can run it
    here), the budget, the cost model and the runner. Returns the resolved target."""
    target = resolve_target(spec.target)
    Budget(spec.trials, spec.max_trials_per_task, spec.seed, spec.time_budget_s)
    check_cost_model(spec.cost_model)
    check_precision(spec.precision)
    if spec.space is not None:
        try:
            check_space(spec.space, str(target.get("kind")))
        except ValueError as exc:
            raise InvalidSpec(str(exc)) from None
    validate_runner(spec.runner)
    if spec.runner.is_local:
        check_runs_here(target)
    return target


def submit_job(store: Store, spec: JobSpec, owner: str = "", settings: Settings | None = None) -> Job:
    """Validate a spec (:func:`validate_spec`, and its input shapes against the model of ``owner``) and
    queue a job for it.

    With ``settings``, a job whose task preview (the same plan) was refused for a limit is refused too,
    with the preview's reason: it would spend its limits to fail the same way.
    """
    model = store.get_model(spec.model_id, owner)
    target = validate_spec(spec)
    _check_input_shapes(model, spec)
    if settings is not None:
        refusal = preview_refusal(store, settings, model, target, spec.input_shapes, spec.precision)
        if refusal is not None:
            raise refusal
    if spec.float_model_id is not None:
        _check_float_model(model, store.get_model(spec.float_model_id, owner))
    # The job records the space that tunes it, the target's default when the user named none.
    space = spec.space or default_space_name(to_tvm_target(target))
    spec = JobSpec.from_dict({**spec.to_dict(), "target": target, "space": space})
    return store.create_job(spec, canonical_target_key(target), owner)


def _check_input_shapes(model: ModelInfo, spec: JobSpec) -> None:
    names = [t.name for t in model.signature.inputs]
    unknown = sorted(set(spec.input_shapes) - set(names))
    if unknown:
        raise InvalidSpec(f"input_shapes names unknown inputs {unknown}; the model's inputs are {names}")
    for t in model.signature.inputs:
        if not t.is_static and t.name not in spec.input_shapes:
            example = [d if isinstance(d, int) else 1 for d in t.shape]
            raise MissingInputShape(
                f"input '{t.name}' has dynamic dimensions {list(t.shape)}: give its shape in input_shapes, "
                f'e.g. {{"{t.name}": {example}}}'
            )
    declared = {t.name: t for t in model.signature.model_inputs}
    for name, shape in spec.input_shapes.items():
        if any(type(d) is not int for d in shape):
            raise InvalidSpec(f"input_shapes['{name}'] must be integers, got {list(shape)}")
        check_given_shape(declared[name], tuple(shape))


def _check_float_model(model: ModelInfo, float_model: ModelInfo) -> None:
    """The float model a job compares with must take the same inputs and give as many outputs."""
    if float_model.id == model.id:
        raise InvalidSpec("float_model_id names the model being tuned; give the float model it came from")
    mine = [(t.name, t.shape) for t in model.signature.inputs]
    theirs = [(t.name, t.shape) for t in float_model.signature.inputs]
    if mine != theirs or len(model.signature.outputs) != len(float_model.signature.outputs):
        raise InvalidSpec(
            f"the float model '{float_model.name}' takes inputs {theirs} and gives "
            f"{len(float_model.signature.outputs)} outputs; the model tuned takes {mine} and gives "
            f"{len(model.signature.outputs)}"
        )


def measuring_caches(settings: Settings, runs_here: bool) -> CacheHierarchy:
    """The caches of the device a job measures on when it runs here: this machine's (or the settings');
    for remote devices, the sizes the settings give for them (unknown without: no cache-based pruning)."""
    if runs_here:
        return host_caches(settings.cache_sizes)
    if settings.rpc_cache_sizes:
        return parse_cache_spec(settings.rpc_cache_sizes, source="settings (rpc devices)")
    return UNKNOWN


def job_caches(settings: Settings, spec: JobSpec) -> CacheHierarchy:
    """The caches of the job's measuring device: this machine's, or what the RPC device reports (Kiln's
    servers do) when the job's space uses them, else the settings' sizes for remote devices."""
    if spec.runner.is_local:
        return measuring_caches(settings, True)
    if spec.space is not None and get_space(spec.space).seeded:
        reported = device_caches(spec.runner, settings.rpc_timeout_s)
        if reported is not None and reported.known:
            return reported
    return measuring_caches(settings, False)


def space_options(settings: Settings, spec: JobSpec) -> SpaceOptions:
    """What the job's space may assume of the measuring device, and the settings of its hooks."""
    caches = job_caches(settings, spec)
    return SpaceOptions(caches, settings.poly_margin, settings.poly_pass_through, settings.poly_seeds)


def measure_config(settings: Settings, spec: JobSpec) -> MeasureConfig:
    """Measurement settings of a job: the service's settings plus the job's runner, cost model and space."""
    return MeasureConfig(
        number=settings.measure_number,
        repeat=settings.measure_repeat,
        min_repeat_ms=settings.measure_min_repeat_ms,
        builder_workers=settings.builder_workers,
        trials_per_iter=settings.num_trials_per_iter,
        population_size=settings.search_population,
        default_schedules=settings.default_schedules,
        cost_model=spec.cost_model,
        runner=spec.runner,
        space=spec.space,
        space_options=space_options(settings, spec),
    )


def _input_shapes(model: ModelInfo, spec: JobSpec) -> dict[str, tuple[int, ...]]:
    if spec.input_shapes:
        return dict(spec.input_shapes)
    return {t.name: tuple(int(d) for d in t.shape) for t in model.signature.inputs if t.is_static}


def run_job(
    store: Store,
    settings: Settings,
    job_id: str,
    listener: JobListener | None = None,
    should_stop: Any = None,
    worker: str | None = None,
    on_abort: Callable[[str], None] | None = None,
) -> JobResult:
    """Run a queued job in this process to its end (the CLI's path; the service uses workers).

    The job is held to the limits a worker holds its jobs to (:class:`~tuner.jobs.guard.InProcessGuard`):
    at a limit, or on SIGINT/SIGTERM when called from the main thread, its outcome is recorded, the
    processes it started are killed and this process ends, after telling ``on_abort`` why. Otherwise the
    job row ends ``succeeded``, ``failed`` or ``cancelled`` when this returns or raises.
    """
    job = store.mark_job_running(job_id, worker or cli_worker_name())
    recorder = JobRecorder(store, job_id, listener)
    guard = InProcessGuard(store, settings, job, lambda: recorder.current_stage, on_abort)
    with recorder.heartbeat(job.worker or "", settings.heartbeat_s), guard:
        try:
            return _execute(settings, job, recorder, should_stop)
        except KeyboardInterrupt:
            recorder.ended(JobStatus.CANCELLED, "interrupted by the user; measured records were kept")
            raise


def execute_job(
    store: Store,
    settings: Settings,
    job: Job,
    listener: JobListener | None = None,
    should_stop: Any = None,
) -> JobResult:
    """Run a job already marked running (by :func:`run_job` or a worker's claim) and record its outcome.

    A job that ran before (its worker died) resumes: its tasks are reused and its budget counts the
    records it already measured, which the search also starts from.
    """
    return _execute(settings, job, JobRecorder(store, job.id, listener), should_stop)


def _execute(settings: Settings, job: Job, recorder: JobRecorder, should_stop: Any) -> JobResult:
    try:
        return _run(recorder.store, settings, job, recorder, should_stop)
    except Exception as exc:
        # The user is told why in one sentence; the traceback stays in the job's crash report.
        reason = describe_failure(exc, recorder.current_stage)
        if not isinstance(exc, KilnError):
            write_crash_report(crash_report_path(settings.jobs_dir, job.id), exc, recorder.current_stage)
        recorder.ended(JobStatus.FAILED, reason)
        if isinstance(exc, KilnError):
            raise
        raise TuningFailed(reason) from exc


def _run(store: Store, settings: Settings, job: Job, recorder: JobRecorder, should_stop: Any) -> JobResult:
    spec = job.spec
    validate_spec(spec)  # the same checks as at submission: a job stored by other means fails here, clearly
    model = store.get_model(spec.model_id)
    recorder.stage("importing")
    target = to_tvm_target(spec.target)
    # The same memory bound as the sandbox's: a model that folds into gigabytes fails this job with the
    # reason instead of exhausting the worker's machine.
    path = model_file(store, settings, model.id)
    try:
        with memory_limit(settings.import_memory_mb):
            imported = load_model(
                path,
                _input_shapes(model, spec),
                max_unpacked_bytes=settings.max_unpacked_mb << 20,
            )
            recorder.stage("extracting tasks")
            plan = plan_graph(
                imported.mod,
                target,
                settings.planning_options(spec.precision),
                record_levels=True,
            )
    except Exception as exc:
        if is_out_of_memory(exc):
            raise SandboxLimits.from_settings(settings).too_much_memory(file_bytes(path)) from None
        raise
    store.set_ir_levels(job.id, plan.levels)
    scope = settings.record_scope(job.owner)
    database = KilnDatabase(store, job.target_key, job_id=job.id, owner=scope)
    recorder.planned(_register_tasks(store, job, plan, database, scope), plan.fusion, spec.trials or 0)
    # A resumed job spends what its earlier attempts left of the trials and of the time.
    trials_left = None if spec.trials is None else max(0, spec.trials - recorder.trials_done)
    budget = Budget(trials_left, spec.max_trials_per_task, spec.seed, spec.time_budget_s)
    with recorder.tuning(spec.time_budget_s, job.tuning_s) as clock:
        time_left = clock.remaining_s()
        if trials_left != 0 and (time_left is None or time_left > 0):
            check_runner(spec.runner, settings.rpc_timeout_s)
            config = measure_config(settings, spec)
            # The cost model kept for this target starts trained on every record measured on it before.
            cost_model, learnt_up_to = (
                load_cost_model(store, target, job.target_key, scope)
                if config.cost_model == "xgb"
                else (None, 0)
            )
            report = tune_tasks(
                plan.tasks,
                target,
                database,
                budget,
                config,
                settings.jobs_dir / job.id / "metaschedule",
                on_batch=recorder.on_batch,
                should_stop=should_stop,
                time_left_s=clock.remaining_s,
                limits=_measuring_host_limits(store, spec),
                cost_model=cost_model,
            )
            if cost_model is not None:
                keep_cost_model(store, cost_model, target, job.target_key, scope, learnt_up_to, job.id)
            for index, stats in report.search_stats.items():
                store.set_search_stats(recorder.tasks[index].id, stats)
    if should_stop is not None and should_stop():
        recorder.ended(JobStatus.CANCELLED, "cancelled; the records measured so far were kept")
        return JobResult(store.get_job(job.id), recorder.tasks, plan.fusion, None, [], Latencies())

    recorder.stage("compiling")
    build_dir = settings.jobs_dir / job.id / "build"
    # A kernel without a measured record gets the best schedule Kiln can build without measuring (the
    # same choice as the torch.compile backend's), never serial loops.
    chosen, choices = choose_schedules(plan.tasks, target, database, job_caches(settings, spec))
    store.set_schedule_sources(
        {task.id: choice.source.value for task, choice in zip(recorder.tasks, choices, strict=True)}
    )
    tuned_exe = build_tuned(plan, target, chosen)
    _keep_assembly(store, store.list_tasks(job.id), model_assembly(tuned_exe))
    tuned_lib = export_library(tuned_exe, build_dir / "model.so", amx=bool(amx_kinds(target)))
    comparisons: list[Comparison] = []
    latency = Latencies()
    accuracy = None
    if is_host_cpu(spec.target):
        recorder.stage("verifying")
        inputs = random_inputs(imported.signature, spec.seed)
        untuned_exe = build_untuned(imported.mod, target)
        floats = _float_reference(store, settings, spec, target)
        quantized = bool(plan.fusion.integer_ops or plan.fusion.kept_float)
        if plan.fusion.reduced_ops:  # bf16/fp16 products: held to the policy's norm-wise error
            comparisons, accuracy = verify_reduced_precision(
                imported, tuned_exe, untuned_exe, spec.seed, spec.precision, floats
            )
        else:
            comparisons = verify_outputs(settings, imported, tuned_exe, untuned_exe, inputs, quantized)
        if quantized or (floats is not None and accuracy is None):
            accuracy = measure_accuracy(imported, tuned_exe, spec.seed, floats) or accuracy
        recorder.stage("measuring")
        latency = measure_latencies(
            imported, untuned_exe, tuned_lib, build_dir, inputs, settings.latency_rounds
        )
        if settings.profile_budget_s > 0:
            recorder.stage("profiling")
            _keep_profile(store, settings, job, imported, plan, tuned_lib, inputs, latency)

    recorder.stage("packaging")
    tasks = store.list_tasks(job.id)
    manifest = job_manifest(
        store.get_job(job.id), model, imported, plan, tasks, latency, comparisons, settings, accuracy
    )
    rows = store.job_records(job, scope)
    packed = pack_artifact(tuned_lib, manifest, rows, settings.data_dir / "artifacts" / f"{job.id}.tar.gz")
    shutil.rmtree(build_dir, ignore_errors=True)
    artifact = recorder.artifact(str(packed.path.resolve()), packed.sha256, packed.size_bytes)
    recorder.succeeded(latency, accuracy)
    return JobResult(store.get_job(job.id), tasks, plan.fusion, artifact, comparisons, latency)


def _keep_assembly(store: Store, tasks: list[Task], asm: str) -> None:
    """Keep each task's kernel as compiled into the model, with its instruction mix."""
    functions = split_functions(asm)
    for task in tasks:
        text = kernel_assembly(functions, task.name)
        if text:
            store.set_task_assembly(task.id, text, instruction_mix(text))


def _keep_profile(
    store: Store,
    settings: Settings,
    job: Job,
    imported: ImportedModel,
    plan: GraphPlan,
    tuned_lib: Path,
    inputs: list[np.ndarray],
    latency: Latencies,
) -> None:
    """Profile the tuned model kernel by kernel (and onnxruntime beside it) and keep the profile. A profile
    explains the job's result and is not part of it: one that fails is logged and the job goes on."""
    onnx_file, note = onnxruntime_model(imported, tuned_lib.parent)
    try:
        profile = profile_model(
            tuned_lib,
            kernel_flops(plan.lowered),
            inputs,
            tuned_lib.parent,
            onnx_file,
            note,
            latency.tuned_ms,
            host_limits(store, job.spec.target),
            settings.profile_budget_s,
            latency.references_ms.get("onnxruntime"),
        )
    except RuntimeError as exc:
        log.warning("job %s: profiling its tuned model failed: %s", job.id, exc)
        return
    store.set_job_profile(job.id, profile)


def _measuring_host_limits(store: Store, spec: JobSpec) -> MachineLimits | None:
    """This machine's roofs when the job measures its candidates here (the scheduler's rooflines), measured
    once per host and kept."""
    if spec.runner.kind != "local" or not is_host_cpu(spec.target):
        return None
    return host_limits(store, spec.target)


def _float_reference(store: Store, settings: Settings, spec: JobSpec, target: Any) -> FloatReference | None:
    """The job's float model, ready to run on the accuracy report's inputs (None: the job names none)."""
    if spec.float_model_id is None:
        return None
    info = store.get_model(spec.float_model_id)
    with memory_limit(settings.import_memory_mb):
        imported = load_model(
            model_file(store, settings, info.id),
            _input_shapes(info, spec),
            max_unpacked_bytes=settings.max_unpacked_mb << 20,
        )
    return float_reference(info.name, imported, target)


def _register_tasks(
    store: Store, job: Job, plan: GraphPlan, database: KilnDatabase, scope: str | None
) -> list[Task]:
    existing = store.list_tasks(job.id)
    if existing:
        return _resumed_tasks(store, job, existing, scope)
    rows = [
        {
            "name": info.name,
            "weight": info.weight,
            "flops": info.flops,
            "workload_id": database.commit_workload_id(task.dispatched[0]),
        }
        for task, info in zip(plan.tasks, plan.infos, strict=True)
    ]
    tasks = store.add_tasks(job.id, rows)
    # A workload tuned by an earlier job on this target starts from its best record.
    warm = []
    for task in tasks:
        best = store.best_latency_us(task.workload_id, job.target_key, scope)
        warm.append(store.update_task(task.id, trials=0, best_latency_us=best) if best is not None else task)
    return warm


def _resumed_tasks(store: Store, job: Job, tasks: list[Task], scope: str | None) -> list[Task]:
    """A rerun job's tasks, their trials recounted from the records the earlier attempts committed."""
    measured = store.job_trial_counts(job.id)
    resumed = []
    for task in tasks:
        best = store.best_latency_us(task.workload_id, job.target_key, scope)
        resumed.append(
            store.update_task(task.id, trials=measured.get(task.workload_id, 0), best_latency_us=best)
        )
    log.info("job %s resumes with %d trials already measured", job.id, sum(t.trials for t in resumed))
    return resumed


def artifact_path(store: Store, job_id: str) -> Path:
    """Path of a succeeded job's packed artifact."""
    return Path(store.get_artifact(job_id).path)
