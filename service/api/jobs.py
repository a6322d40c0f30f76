"""``/api/v1/jobs``: submit, list, watch (SSE), cancel, inspect tasks, download artifacts and records."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from sse_starlette.sse import EventSourceResponse

from service.deps import OwnerDep, ServiceState, StateDep
from service.disconnect import while_connected
from service.schemas import (
    BestOut,
    CurveOut,
    CurvePoint,
    ErrorOut,
    FusionOut,
    GraphOut,
    IrLevelOut,
    IrLevelTextOut,
    JobCurveOut,
    JobCurvePoint,
    JobIn,
    JobOut,
    JobPage,
    KernelAssemblyOut,
    LocalRunner,
    ProfileOut,
    RPCRunner,
    TaskGroupOut,
    TaskOut,
)
from service.schemas.polyhedral import PolyhedralOut
from tuner.entities import (
    AccuracyBudget,
    Job,
    JobSpec,
    JobStatus,
    ModelPlan,
    RunnerSpec,
    Task,
    trial_budget,
    trials_shortfall,
)
from tuner.errors import Conflict, NotFound
from tuner.jobs.artifact import records_tarball
from tuner.jobs.submission import submit_job
from tuner.model_registry import artifact_file_name
from tuner.rpc.tracker import allowed_tracker
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.timing.profile_check import job_profile as profile_of_job
from tuner.views import inspection, lowering
from tuner.views.inspection import best_schedule, plan_model, task_tir

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])

ERRORS = {401: {"model": ErrorOut}, 404: {"model": ErrorOut}, 422: {"model": ErrorOut}}


def job_out(store: Store, job: Job, model_names: dict[str, str] | None = None) -> JobOut:
    names = model_names if model_names is not None else {}
    if job.spec.model_id not in names:
        names[job.spec.model_id] = store.get_model(job.spec.model_id).name
    progress = store.job_progress(job.id)
    out = JobOut.of(job, progress, names[job.spec.model_id])
    if job.spec.workers > 1:
        out.task_groups = [TaskGroupOut.from_entity(group) for group in store.task_groups(job.id)]
    if job.status is JobStatus.SUCCEEDED and job.spec.trials and progress["trials_done"] < job.spec.trials:
        out.trials_note = trials_shortfall(job, store.list_tasks(job.id))
    return out


def _task(store: Store, job: Job, task_id: int) -> Task:
    for task in store.list_tasks(job.id):
        if task.id == task_id:
            return task
    raise NotFound(f"job '{job.id}' has no task {task_id}")


# Submissions are short and CPU-bound (validation, a few inserts): a burst of them in the whole request pool
# would take turns on the interpreter with everything else (50 at once held /healthz for 0.6 s). They run
# two at a time; the rest wait without a thread.
_submissions = anyio.CapacityLimiter(2)


@router.post("", status_code=202, response_model=JobOut, responses=ERRORS, summary="Queue a tuning job")
async def create_job(body: JobIn, state: StateDep, owner: OwnerDep) -> JobOut:
    return await anyio.to_thread.run_sync(_create_job, body, state, owner, limiter=_submissions)


def _create_job(body: JobIn, state: ServiceState, owner: str) -> JobOut:
    spec = JobSpec(
        model_id=body.model_id,
        target=body.target,  # type: ignore[arg-type]  # resolved and validated by submit_job
        trials=trial_budget(body.trials, body.time_budget_s),
        time_budget_s=None if body.time_budget_s is None else float(body.time_budget_s),
        max_trials_per_task=body.max_trials_per_task,
        seed=body.seed,
        input_shapes={k: tuple(v) for k, v in (body.input_shapes or {}).items()},
        runner=_runner(body.runner, state.settings),
        cost_model=body.cost_model,
        space=body.space,
        precision=body.precision,
        float_model_id=body.float_model_id,
        workers=body.workers,
        calibration_id=body.calibration_id,
        calibration_method=body.calibration_method,
        accuracy_budget=AccuracyBudget(
            float(body.accuracy_budget.max_top1_changed), float(body.accuracy_budget.max_relative_error)
        )
        if body.accuracy_budget is not None
        else AccuracyBudget(),
    )
    return job_out(state.store, submit_job(state.store, spec, owner, state.settings))


def _runner(runner: LocalRunner | RPCRunner, settings: Settings) -> RunnerSpec:
    """A job's runner; an RPC one only through a tracker the operator configured."""
    if isinstance(runner, LocalRunner):
        return RunnerSpec()
    return RunnerSpec("rpc", allowed_tracker(runner.tracker, settings.allowed_rpc_trackers()), runner.key)


@router.get("", response_model=JobPage, responses=ERRORS, summary="List jobs, newest first")
def list_jobs(
    state: StateDep,
    owner: OwnerDep,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> JobPage:
    jobs = state.store.list_jobs(status, limit=limit, offset=offset, owner=owner)
    names: dict[str, str] = {}
    return JobPage(
        items=[job_out(state.store, j, names) for j in jobs],
        total=state.store.count_jobs(status, owner),
        limit=limit,
        offset=offset,
    )


@router.get("/{job_id}", response_model=JobOut, responses=ERRORS, summary="One job with its progress")
def get_job(job_id: str, state: StateDep, owner: OwnerDep) -> JobOut:
    return job_out(state.store, state.store.get_job(job_id, owner))


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=JobOut,
    responses={**ERRORS, 409: {"model": ErrorOut}},
    summary="Cancel a job; a running one stops within seconds and keeps its measured records",
)
def cancel_job(job_id: str, state: StateDep, owner: OwnerDep) -> JobOut:
    return job_out(state.store, state.store.request_cancel(job_id, owner))


@router.get("/{job_id}/tasks", response_model=list[TaskOut], responses=ERRORS, summary="A job's tasks")
def job_tasks(job_id: str, state: StateDep, owner: OwnerDep) -> list[TaskOut]:
    job = state.store.get_job(job_id, owner)
    return TaskOut.list_of(state.store.list_tasks(job.id))


@router.get(
    "/{job_id}/tasks/{task_id}/curve",
    response_model=CurveOut,
    responses=ERRORS,
    summary="Every trial the job measured for a task, with the best so far",
)
def task_curve(job_id: str, task_id: int, state: StateDep, owner: OwnerDep) -> CurveOut:
    job = state.store.get_job(job_id, owner)
    task = _task(state.store, job, task_id)
    points = [CurvePoint.from_entity(p) for p in inspection.task_curve(state.store, job, task)]
    return CurveOut(task_id=task.id, name=task.name, points=points)


@router.get(
    "/{job_id}/curve",
    response_model=JobCurveOut,
    responses=ERRORS,
    summary="Every trial of the job in order, with the estimated end-to-end latency after it",
)
def job_curve(job_id: str, state: StateDep, owner: OwnerDep) -> JobCurveOut:
    job = state.store.get_job(job_id, owner)
    curve = inspection.job_curve(state.store, job, state.settings.record_scope(job.owner))
    peer = job.peer
    return JobCurveOut(
        points=[JobCurvePoint.from_entity(p) for p in curve.points],
        warm_start_us=curve.warm_start_us,
        peer=peer,
        peer_ms=job.reference_latency_ms[peer] if peer else None,
        latency_ms=job.tuned_latency_ms,
    )


@router.get(
    "/{job_id}/graph",
    response_model=GraphOut,
    responses={**ERRORS, 413: {"model": ErrorOut}},
    summary="The model's Relax program after fusion on the job's target, and the fusion summary",
)
async def job_graph(request: Request, job_id: str, state: StateDep, owner: OwnerDep) -> GraphOut:
    def plan(client_gone: Callable[[], bool]) -> ModelPlan:
        job = state.store.get_job(job_id, owner)
        model = state.store.get_model(job.spec.model_id)
        shapes = {k: list(v) for k, v in job.spec.input_shapes.items()} or None
        return plan_model(
            state.store,
            state.settings,
            state.sandbox,
            model,
            job.spec.target,
            input_shapes=shapes,
            cancelled=client_gone,
            precision=job.spec.precision,
        )

    found = await while_connected(request, plan)
    return GraphOut.from_entity(found, fusion=FusionOut.of(found.fusion))


@router.get(
    "/{job_id}/ir",
    response_model=list[IrLevelOut],
    responses=ERRORS,
    summary="The job's lowering: the program as imported, then after each graph pass, with what it changed",
)
def job_ir_levels(job_id: str, state: StateDep, owner: OwnerDep) -> list[IrLevelOut]:
    job = state.store.get_job(job_id, owner)
    return [IrLevelOut.from_entity(level) for level in lowering.ir_levels(state.store, job)]


@router.get(
    "/{job_id}/ir/{level}",
    response_model=IrLevelTextOut,
    responses=ERRORS,
    summary="One level of the job's lowering, by position or pass name (the first of that name), with its "
    "program as TVMScript",
)
def job_ir_level(job_id: str, level: str, state: StateDep, owner: OwnerDep) -> IrLevelTextOut:
    job = state.store.get_job(job_id, owner)
    return IrLevelTextOut.from_entity(lowering.ir_level(state.store, job, level))


@router.get(
    "/{job_id}/tasks/{task_id}/polyhedral",
    response_model=PolyhedralOut,
    responses=ERRORS,
    summary="A task's loop nest through the polyhedral layer: domain, accesses, dependences, legality, "
    "fusion depths, the best schedule's tiles against the caches, and what the space pruned",
)
def task_polyhedral(job_id: str, task_id: int, state: StateDep, owner: OwnerDep) -> PolyhedralOut:
    job = state.store.get_job(job_id, owner)
    task = _task(state.store, job, task_id)
    return PolyhedralOut.model_validate(inspection.task_polyhedral(state.store, state.settings, job, task))


@router.get(
    "/{job_id}/tasks/{task_id}/best",
    response_model=BestOut,
    responses=ERRORS,
    summary="The fastest schedule found for a task: trace, tuned TIR and TIR before scheduling",
)
def task_best(job_id: str, task_id: int, state: StateDep, owner: OwnerDep) -> BestOut:
    job = state.store.get_job(job_id, owner)
    task = _task(state.store, job, task_id)
    best = best_schedule(state.store, job, task, state.settings.record_scope(job.owner))
    return BestOut.from_entity(best, task_id=task.id, name=task.name, tir_before=task_tir(state.store, task))


@router.get(
    "/{job_id}/tasks/{task_id}/asm",
    response_model=KernelAssemblyOut,
    responses=ERRORS,
    summary="A task's kernel as the CPU runs it: its assembly in the job's compiled model and its "
    "instruction mix (vector FMAs by width, dot-product instructions)",
)
def task_asm(job_id: str, task_id: int, state: StateDep, owner: OwnerDep) -> KernelAssemblyOut:
    job = state.store.get_job(job_id, owner)
    task = _task(state.store, job, task_id)
    return KernelAssemblyOut.from_entity(state.store.get_task_assembly(task.id))


@router.get(
    "/{job_id}/profile",
    response_model=ProfileOut,
    responses=ERRORS,
    summary="The tuned model's profile, kernel by kernel: calls, time, share, GFLOP/s, bytes moved, its "
    "place under this machine's roofline, and onnxruntime's nodes matched to it",
)
def job_profile(job_id: str, state: StateDep, owner: OwnerDep) -> ProfileOut:
    job = state.store.get_job(job_id, owner)
    return ProfileOut.of(job.id, *profile_of_job(state.store, job))


def job_snapshot(store: Store, job_id: str) -> tuple[dict[str, Any], bool]:
    """What an event carries: the job and its tasks as JSON-ready data, and whether the job has finished."""
    job = store.get_job(job_id)
    data: dict[str, Any] = {
        "job": job_out(store, job).model_dump(mode="json"),
        "tasks": [t.model_dump(mode="json") for t in TaskOut.list_of(store.list_tasks(job_id))],
    }
    return data, job.status.finished


@router.get(
    "/{job_id}/events",
    responses={**ERRORS, 429: {"model": ErrorOut}, 200: {"content": {"text/event-stream": {}}}},
    summary="Server-Sent Events: 'progress' events while the job runs, one 'end' event when it ends",
)
async def job_events(job_id: str, state: StateDep, owner: OwnerDep) -> EventSourceResponse:
    await run_in_threadpool(state.store.get_job, job_id, owner)
    state.events.check_room(owner)  # 429 before the stream starts

    async def stream() -> AsyncIterator[dict[str, str]]:
        async with state.events.subscribe(job_id, owner) as mailbox:
            while True:
                event, data = await mailbox.get()
                yield {"event": event, "data": data}
                if event == "end":
                    return

    return EventSourceResponse(stream(), ping=15)


def _require_succeeded(job: Job) -> None:
    if job.status is not JobStatus.SUCCEEDED:
        state = f"{job.status.value}" + (f" ({job.stage})" if job.stage and not job.status.finished else "")
        raise Conflict(f"job '{job.id}' is {state}; its artifact exists once the job has succeeded")


@router.get(
    "/{job_id}/artifact",
    response_class=FileResponse,
    responses={**ERRORS, 409: {"model": ErrorOut}, 200: {"content": {"application/gzip": {}}}},
    summary="The compiled, verified model package (.tar.gz)",
)
def job_artifact(job_id: str, state: StateDep, owner: OwnerDep) -> FileResponse:
    job = state.store.get_job(job_id, owner)
    _require_succeeded(job)
    artifact = state.store.get_artifact(job.id)
    path = Path(artifact.path)
    if not path.is_file():
        raise NotFound(f"the artifact file of job '{job.id}' is missing from the data directory")
    model = state.store.get_model(job.spec.model_id)
    return FileResponse(
        path,
        media_type="application/gzip",
        filename=artifact_file_name(model.name, job.id),
        headers={"X-Kiln-Sha256": artifact.sha256},
    )


@router.get(
    "/{job_id}/records",
    response_class=Response,
    responses={**ERRORS, 200: {"content": {"application/gzip": {}}}},
    summary="The job's tasks' tuning records as a MetaSchedule JSON database (.tar.gz)",
)
def job_records(job_id: str, state: StateDep, owner: OwnerDep) -> Response:
    job = state.store.get_job(job_id, owner)
    rows = state.store.job_records(job, state.settings.record_scope(job.owner))
    return Response(
        records_tarball(rows),
        media_type="application/gzip",
        headers={"Content-Disposition": f'attachment; filename="records-{job.id[:8]}.tar.gz"'},
    )
