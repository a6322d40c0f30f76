"""The FastAPI application: ``create_app(settings)`` builds everything; nothing is built at import time."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

import tuner
from service.api import calibrations, devices, jobs, models, system
from service.api.jobs import job_snapshot
from service.auth import Authenticator, AuthGate
from service.body_limits import BodySizeLimit
from service.deps import ServiceState
from service.errors import install_error_handlers
from service.events import EVENT_POLL_S, JobEvents
from tuner.isolation.sandbox import ModelSandbox
from tuner.jobs.worker import WorkerPool
from tuner.model_registry import clean_upload_spools
from tuner.settings import Settings
from tuner.store.sql import Store

log = logging.getLogger(__name__)

# The dashboard: plain HTML/JS/CSS and vendored libraries, served as they are (no build step).
STATIC_DIR = Path(__file__).resolve().parent / "static"


def create_app(
    settings: Settings, *, embedded_workers: int | None = None, store: Store | None = None
) -> FastAPI:
    """The Kiln service on ``settings``; ``embedded_workers`` overrides ``settings.embedded_workers``.

    Raises :class:`~tuner.errors.SchemaOutdated` (naming the command to run) on an old database schema.
    """
    store = store or Store.from_settings(settings)
    store.ensure_schema(auto_create=True)
    workers = settings.embedded_workers if embedded_workers is None else embedded_workers
    settings = settings.model_copy(update={"embedded_workers": workers})
    auth = Authenticator(settings, store)
    log.info("API tokens %s", "required" if auth.required else "not required")
    sandbox = ModelSandbox(settings)
    events = JobEvents(
        lambda job_id: job_snapshot(store, job_id), EVENT_POLL_S, settings.max_streams_per_user
    )
    state = ServiceState(settings=settings, store=store, auth=auth, sandbox=sandbox, events=events)
    # Spools of uploads a dead server was importing; newer ones may be another server's, in progress.
    clean_upload_spools(settings, older_than_s=settings.import_timeout_s + 60)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        pool = WorkerPool(settings, workers, store) if workers else None
        if pool is not None:
            pool.start()
            log.info("%d embedded worker(s) serving jobs", workers)
        try:
            yield
        finally:
            if pool is not None:
                pool.stop()  # running jobs go back to the queue
            events.close()
            sandbox.close()

    app = FastAPI(
        title="Kiln",
        version=tuner.__version__,
        description=(
            "Auto-tuning service for deep-learning models on Apache TVM: upload an ONNX model or a "
            "torch.export program, tune it with MetaSchedule, download the compiled artifact."
        ),
        lifespan=lifespan,
        # Served below from the vendored Swagger UI: FastAPI's defaults load it from a CDN, which a machine
        # without internet access cannot reach (a blank page).
        docs_url=None,
        redoc_url=None,
    )
    app.state.kiln = state
    install_error_handlers(app)
    app.add_middleware(
        BodySizeLimit,
        upload_bytes=settings.max_upload_mb << 20,
        json_bytes=settings.max_json_kb << 10,
        # the multipart envelope around the file, on top of the file's own limit
        calibration_bytes=(settings.max_calibration_mb << 20) + (64 << 10),
    )
    app.add_middleware(AuthGate, auth=auth)  # outermost: no body is read for an unauthenticated request
    for router in (models.router, calibrations.router, jobs.router, devices.router, system.router):
        app.include_router(router)

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/docs", include_in_schema=False)
    def api_docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title="Kiln API",
            swagger_js_url="/static/vendor/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url="/static/vendor/swagger-ui/swagger-ui.css",
            swagger_favicon_url="/static/vendor/swagger-ui/favicon-32x32.png",
        )

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    return app
