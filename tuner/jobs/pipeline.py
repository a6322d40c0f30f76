"""A tuning job run end to end (:func:`run_job`, :func:`execute_job`), as a sequence of stages:

1. :func:`_plan`: import the model and run the graph passes; register the tasks (or recount a resumed
   job's).
2. :func:`_tune`: MetaSchedule over the tasks, within what is left of the budget; a job split over several
   workers tunes groups of its tasks on each (:mod:`tuner.jobs.task_groups`).
3. :func:`_compile`: each kernel's best record (or a schedule built without measuring), compiled.
4. :func:`_check` (on this machine's CPU): verify the outputs, time the artifact side by side, profile it.
5. :func:`_package`: the manifest and the artifact.

Each stage records what it did through the job's :class:`~tuner.jobs.recorder.JobRecorder` only, as it
happens: a job that dies midway leaves its measured records behind and the next run of the same model on
the same target starts from them. Checking and queueing a job is :mod:`tuner.jobs.submission`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from schedules.amx import amx_kinds
from tuner.compile import build_tuned, build_untuned, model_assembly, random_inputs
from tuner.entities import (
    AccuracyReport,
    Artifact,
    Budget,
    FusionSummary,
    Job,
    JobSpec,
    JobStatus,
    ModelInfo,
    QuantizationReport,
    Task,
)
from tuner.errors import KilnError, TuningFailed
from tuner.frontend import ImportedModel, load_model
from tuner.isolation.sandbox import SandboxLimits, file_bytes, is_out_of_memory, memory_limit
from tuner.jobs.artifact import export_library, pack_artifact
from tuner.jobs.failures import crash_report_path, describe_failure, write_crash_report
from tuner.jobs.in_process import InProcessGuard, cli_worker_name
from tuner.jobs.manifest import job_manifest
from tuner.jobs.measuring import job_caches
from tuner.jobs.quantizing import quantize_model, quantizes, with_int8_choice
from tuner.jobs.recorder import JobListener, JobRecorder
from tuner.jobs.search_run import search_tasks
from tuner.jobs.stop import current_stop_reason
from tuner.jobs.submission import job_input_shapes
from tuner.jobs.target_check import validate_spec
from tuner.jobs.task_groups import tune_split
from tuner.metaschedule.database import KilnDatabase
from tuner.model_registry import model_file
from tuner.passes.plan import GraphPlan
from tuner.passes.precision import RELATIVE_TOLERANCE
from tuner.rpc.tracker import check_runner
from tuner.schedule_choice import choose_schedules
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.targets import is_host_cpu, to_tvm_target
from tuner.timing.precision_choice import plan_for_precision
from tuner.timing.profile import host_limits, kernel_flops, kernel_precisions, profile_model
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


def run_job(
    store: Store,
    settings: Settings,
    job_id: str,
    *,
    listener: JobListener | None = None,
    should_stop: Any = None,
    worker: str | None = None,
    on_abort: Callable[[str], None] | None = None,
) -> JobResult:
    """Run a queued job in this process to its end (the CLI's path; the service uses workers).

    The job is held to the limits a worker holds its jobs to (:class:`~tuner.jobs.in_process.InProcessGuard`):
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
    *,
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
        return _run(settings, job, recorder, should_stop)
    except Exception as exc:
        # The user is told why in one sentence; the traceback stays in the job's crash report.
        reason = describe_failure(exc, recorder.current_stage)
        if not isinstance(exc, KilnError):
            write_crash_report(crash_report_path(settings.jobs_dir, job.id), exc, recorder.current_stage)
        recorder.ended(JobStatus.FAILED, reason)
        if isinstance(exc, KilnError):
            raise
        raise TuningFailed(reason) from exc


@dataclass(frozen=True)
class _Planned:
    """What the first stage leaves: the model, its import and plan, and the records the job reads."""

    model: ModelInfo
    imported: ImportedModel
    plan: GraphPlan
    target: Any  # tvm.target.Target
    scope: str | None  # whose records the job reads (None: everyone's)
    database: KilnDatabase
    #: The int8 policy: how the float model was quantized (its float model: ``model``'s own file).
    quantization: QuantizationReport | None = None


@dataclass(frozen=True)
class _Built:
    """The compiled model: its executable, and its library in the job's build directory."""

    tuned_exe: Any
    tuned_lib: Path


@dataclass(frozen=True)
class _Checked:
    """What checking the compiled model on this machine found (nothing, for a target elsewhere)."""

    comparisons: list[Comparison] = field(default_factory=list)
    latency: Latencies = field(default_factory=Latencies)
    accuracy: AccuracyReport | None = None


def _run(settings: Settings, job: Job, recorder: JobRecorder, should_stop: Any) -> JobResult:
    validate_spec(job.spec)  # the same checks as at submission: a job stored by other means fails here
    planned = _plan(settings, job, recorder)
    _tune(settings, job, planned, recorder, should_stop)
    if should_stop is not None and should_stop():
        reason = current_stop_reason(recorder.store, job.id, job.worker)
        if reason.ends_job:
            recorder.ended(JobStatus.CANCELLED, "cancelled; the records measured so far were kept")
        else:  # another worker resumes the job from the store: this run records nothing more
            log.warning("job %s was taken over by another worker; this run stops", job.id)
        job_now = recorder.store.get_job(job.id)
        return JobResult(job_now, recorder.tasks, planned.plan.fusion, None, [], Latencies())
    built = _compile(settings, job, planned, recorder)
    checked = _check(settings, job, planned, built, recorder) if is_host_cpu(job.spec.target) else _Checked()
    return _package(settings, job, planned, built=built, checked=checked, recorder=recorder)


def _plan(settings: Settings, job: Job, recorder: JobRecorder) -> _Planned:
    """Import the model and run the graph passes, under the import's memory bound; register the tasks."""
    spec, store = job.spec, recorder.store
    model = store.get_model(spec.model_id)
    recorder.stage("importing")
    target = to_tvm_target(spec.target)
    # The same memory bound as the sandbox's: a model that folds into gigabytes fails this job with the
    # reason instead of exhausting the worker's machine.
    path = model_file(store, settings, model.id)
    shapes = job_input_shapes(model, spec)
    quantization = None
    try:
        with memory_limit(settings.import_memory_mb):
            if quantizes(spec):
                recorder.stage("quantizing")
                workdir = settings.jobs_dir / job.id / "quantization"
                path, quantization = quantize_model(
                    settings, spec, model, path, shapes=shapes, workdir=workdir
                )
                recorder.stage("importing")
            imported = load_model(path, shapes, max_unpacked_bytes=settings.max_unpacked_mb << 20)
            recorder.stage("extracting tasks")
            plan = plan_for_precision(
                imported,
                target,
                # a quantized model is planned as it is: its float operators are those the budget needs
                settings.planning_options("as-is" if quantization is not None else spec.precision),
                runs_here=is_host_cpu(spec.target),
                record_levels=True,
            )
            if quantization is not None:
                plan = with_int8_choice(plan, spec.precision, quantization)
    except Exception as exc:
        if is_out_of_memory(exc):
            raise SandboxLimits.from_settings(settings).too_much_memory(file_bytes(path)) from None
        raise
    recorder.levels(plan.levels)
    scope = settings.record_scope(job.owner)
    database = KilnDatabase(store, job.target_key, job_id=job.id, owner=scope)
    if store.list_tasks(job.id):  # a job that ran before: its tasks, their trials recounted
        tasks = recorder.resumed_tasks(job.target_key, scope)
    else:
        workloads = [database.commit_workload_id(task.dispatched[0]) for task in plan.tasks]
        tasks = recorder.new_tasks(plan.infos, workloads, job.target_key, scope)
    recorder.planned(tasks, plan.fusion, spec.trials or 0)
    return _Planned(model, imported, plan, target, scope, database, quantization)


def _tune(settings: Settings, job: Job, planned: _Planned, recorder: JobRecorder, should_stop: Any) -> None:
    """MetaSchedule over the tasks, within what earlier attempts left of the trials and of the time."""
    spec = job.spec
    trials_left = None if spec.trials is None else max(0, spec.trials - recorder.trials_done)
    budget = Budget(trials_left, spec.max_trials_per_task, spec.seed, spec.time_budget_s)
    with recorder.tuning(spec.time_budget_s, job.tuning_s) as clock:
        time_left = clock.remaining_s()
        if trials_left == 0 or (time_left is not None and time_left <= 0):
            return
        check_runner(spec.runner, settings.rpc_timeout_s)
        if spec.workers > 1 and len(recorder.tasks) > 1:
            groups = tune_split(
                recorder.store,
                settings,
                job,
                recorder.tasks,
                worker=job.worker or cli_worker_name(),
                should_stop=should_stop,
                time_left_s=clock.remaining_s,
                on_measured=recorder.measured_elsewhere,
            )
            recorder.split_tuned(groups)
            return
        search_tasks(
            recorder.store,
            settings,
            job,
            tasks=recorder.tasks,
            extracted=planned.plan.tasks,
            database=planned.database,
            target=planned.target,
            budget=budget,
            work_dir=settings.jobs_dir / job.id / "metaschedule",
            on_batch=recorder.on_batch,
            should_stop=should_stop,
            time_left_s=clock.remaining_s,
        )


def _compile(settings: Settings, job: Job, planned: _Planned, recorder: JobRecorder) -> _Built:
    """Compile each kernel with its best record; a kernel without one gets the best schedule Kiln can build
    without measuring (the same choice as the torch.compile backend's); serial loops only where no rule,
    modelled tiling or design-space sample applies."""
    recorder.stage("compiling")
    chosen, choices = choose_schedules(
        planned.plan.tasks, planned.target, planned.database, job_caches(settings, job.spec)
    )
    recorder.schedule_sources([choice.source.value for choice in choices])
    tuned_exe = build_tuned(planned.plan, planned.target, chosen)
    functions = split_functions(model_assembly(tuned_exe))
    recorder.assembly(
        {
            task.id: (text, instruction_mix(text))
            for task in recorder.tasks
            if (text := kernel_assembly(functions, task.name))
        }
    )
    lib_path = settings.jobs_dir / job.id / "build" / "model.so"
    return _Built(tuned_exe, export_library(tuned_exe, lib_path, amx=bool(amx_kinds(planned.target))))


def _check(settings: Settings, job: Job, planned: _Planned, built: _Built, recorder: JobRecorder) -> _Checked:
    """Verify the compiled model's outputs, time it beside untuned TVM and onnxruntime, and profile it."""
    spec, imported, plan = job.spec, planned.imported, planned.plan
    recorder.stage("verifying")
    inputs = random_inputs(imported.signature, spec.seed)
    untuned_exe = build_untuned(imported.mod, planned.target)
    floats = _float_reference(recorder.store, settings, spec, planned.target)
    if planned.quantization is not None:  # the int8 policy: the float model is the job's own
        floats = _own_float_reference(recorder.store, settings, planned)
    quantized = bool(plan.fusion.integer_ops or plan.fusion.kept_float)
    accuracy = None
    # bf16/fp16 products of a policy: held to its norm-wise error. A model's own bf16 rounding (int8 with
    # operators returned to bf16) is its semantics: compared with onnxruntime running it as written.
    if plan.fusion.reduced_ops and plan.fusion.precision in RELATIVE_TOLERANCE:
        comparisons, accuracy = verify_reduced_precision(
            imported,
            built.tuned_exe,
            untuned_exe,
            seed=spec.seed,
            policy=plan.fusion.precision,
            float_model=floats,
        )
    else:
        comparisons = verify_outputs(
            settings,
            imported,
            built.tuned_exe,
            untuned_exe,
            inputs=inputs,
            reference_semantics=quantized,
            chained_layers=len(plan.fusion.integer_ops),
        )
    if quantized or (floats is not None and accuracy is None):
        accuracy = (
            measure_accuracy(
                imported, built.tuned_exe, spec.seed, floats, chained_layers=len(plan.fusion.integer_ops)
            )
            or accuracy
        )
    if accuracy is not None and planned.quantization is not None:
        accuracy = dataclasses.replace(accuracy, quantization=planned.quantization)
    recorder.stage("measuring")
    latency = measure_latencies(
        imported,
        untuned_exe,
        built.tuned_lib,
        build_dir=built.tuned_lib.parent,
        inputs=inputs,
        rounds=settings.latency_rounds,
    )
    if settings.profile_budget_s > 0:
        recorder.stage("profiling")
        _profile(
            settings,
            job,
            planned,
            tuned_lib=built.tuned_lib,
            inputs=inputs,
            latency=latency,
            recorder=recorder,
        )
    return _Checked(comparisons, latency, accuracy)


def _profile(
    settings: Settings,
    job: Job,
    planned: _Planned,
    *,
    tuned_lib: Path,
    inputs: list[np.ndarray],
    latency: Latencies,
    recorder: JobRecorder,
) -> None:
    """Profile the tuned model kernel by kernel (and onnxruntime beside it) and keep the profile. A profile
    explains the job's result and is not part of it: one that fails is logged and the job goes on."""
    onnx_file, note = onnxruntime_model(planned.imported, tuned_lib.parent)
    try:
        profile = profile_model(
            tuned_lib,
            kernel_flops(planned.plan.lowered),
            inputs,
            work_dir=tuned_lib.parent,
            onnx_file=onnx_file,
            onnxruntime_note=note,
            latency_ms=latency.tuned_ms,
            limits=host_limits(recorder.store, job.spec.target),
            budget_s=settings.profile_budget_s,
            precisions=kernel_precisions(planned.plan.lowered),
            onnxruntime_latency_ms=latency.references_ms.get("onnxruntime"),
        )
    except RuntimeError as exc:
        log.warning("job %s: profiling its tuned model failed: %s", job.id, exc)
        return
    recorder.profile(profile)


def _package(
    settings: Settings,
    job: Job,
    planned: _Planned,
    *,
    built: _Built,
    checked: _Checked,
    recorder: JobRecorder,
) -> JobResult:
    """The manifest and the artifact (the library, the manifest, the records it was built with)."""
    recorder.stage("packaging")
    store = recorder.store
    tasks = store.list_tasks(job.id)
    manifest = job_manifest(
        store.get_job(job.id),
        model=planned.model,
        imported=planned.imported,
        plan=planned.plan,
        tasks=tasks,
        latency=checked.latency,
        comparisons=checked.comparisons,
        settings=settings,
        accuracy=checked.accuracy,
    )
    rows = store.job_records(job, planned.scope)
    destination = settings.data_dir / "artifacts" / f"{job.id}.tar.gz"
    packed = pack_artifact(built.tuned_lib, manifest, rows, destination)
    shutil.rmtree(built.tuned_lib.parent, ignore_errors=True)
    artifact = recorder.artifact(str(packed.path.resolve()), packed.sha256, packed.size_bytes)
    recorder.succeeded(checked.latency, checked.accuracy)
    job_now = store.get_job(job.id)
    return JobResult(job_now, tasks, planned.plan.fusion, artifact, checked.comparisons, checked.latency)


def _own_float_reference(store: Store, settings: Settings, planned: _Planned) -> FloatReference:
    """The float model a quantized job came from (its stored file), ready to run."""
    model = planned.model
    with memory_limit(settings.import_memory_mb):
        imported = load_model(
            model_file(store, settings, model.id),
            {t.name: tuple(int(d) for d in t.shape) for t in planned.imported.signature.inputs},
            max_unpacked_bytes=settings.max_unpacked_mb << 20,
        )
    return float_reference(f"{model.name} (float32)", imported, planned.target)


def _float_reference(store: Store, settings: Settings, spec: JobSpec, target: Any) -> FloatReference | None:
    """The job's float model, ready to run on the accuracy report's inputs (None: the job names none)."""
    if spec.float_model_id is None:
        return None
    info = store.get_model(spec.float_model_id)
    with memory_limit(settings.import_memory_mb):
        imported = load_model(
            model_file(store, settings, info.id),
            job_input_shapes(info, spec),
            max_unpacked_bytes=settings.max_unpacked_mb << 20,
        )
    return float_reference(info.name, imported, target)
