"""``/healthz`` and ``/metrics`` (Prometheus text format)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from service.deps import StateDep
from service.errors import error_response
from service.events import JobEvents
from service.schemas import ErrorOut, HealthOut
from tuner.store.sql import Store

router = APIRouter(tags=["system"])


# Liveness is asked on a thread of its own, never behind busy requests in the request pool (50 job
# submissions at once once held /healthz for 0.6 s).
_health_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-healthz")


@router.get("/healthz", response_model=HealthOut, responses={503: {"model": ErrorOut}}, summary="Liveness")
async def healthz(state: StateDep) -> HealthOut | JSONResponse:
    try:
        revision = await asyncio.get_running_loop().run_in_executor(
            _health_pool, state.store.current_revision
        )
    except Exception as exc:  # the database is down: say so, with the one status monitors look at
        return error_response("database_unavailable", f"the database does not answer: {exc}", 503)
    return HealthOut(
        status="ok",
        database=state.store.backend,
        schema_revision=revision,
        embedded_workers=state.settings.embedded_workers,
        auth=state.auth.required,
    )


class StoreCollector(Collector):
    """Reads Kiln's counters from the database at scrape time (workers may live in other processes)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[object]:
        stats = self.store.service_stats()
        jobs = GaugeMetricFamily("kiln_jobs", "Jobs by status", labels=["status"])
        for status, count in stats["jobs"].items():
            jobs.add_metric([status], count)
        yield jobs
        yield CounterMetricFamily(
            "kiln_trials_measured",
            "Candidates measured by jobs (tuning records written)",
            stats["trials_measured"],
        )
        records = GaugeMetricFamily("kiln_records_stored", "Tuning records in the database", labels=["valid"])
        records.add_metric(["true"], stats["records_valid"])
        records.add_metric(["false"], stats["records_total"] - stats["records_valid"])
        yield records
        yield SummaryMetricFamily(
            "kiln_queue_wait_seconds",
            "Time from submission to the latest start of each started job",
            count_value=stats["queue_wait_count"],
            sum_value=stats["queue_wait_sum_s"],
        )
        yield GaugeMetricFamily(
            "kiln_queue_oldest_wait_seconds",
            "How long the oldest queued job has waited",
            stats["oldest_queued_wait_s"],
        )


class EventsCollector(Collector):
    """This server's open job event streams, and the database polls they cost (one per job, not per stream)."""

    def __init__(self, events: JobEvents) -> None:
        self.events = events

    def collect(self) -> Iterator[object]:
        yield GaugeMetricFamily(
            "kiln_event_streams_open", "Job event streams open", self.events.open_streams()
        )
        yield CounterMetricFamily(
            "kiln_event_polls", "Database polls made for job event streams", self.events.polls
        )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}},
    summary="Prometheus metrics: jobs by status, trials measured, records stored, queue wait",
)
def metrics(state: StateDep) -> Response:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(state.store))
    registry.register(EventsCollector(state.events))
    return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")
