"""The one place where Kiln's typed errors become HTTP responses: ``{"error": {"kind", "message"}}``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuner.errors import (
    Conflict,
    DeviceUnavailable,
    ImportTimeout,
    InvalidModel,
    InvalidSpec,
    KilnError,
    MissingDependency,
    MissingInputShape,
    ModelTooLarge,
    NotFound,
    PayloadTooLarge,
    SchemaOutdated,
    TooManyRequests,
    TuningFailed,
    Unauthorized,
    UnsupportedOperator,
)

log = logging.getLogger(__name__)

# Most specific first: the first class an error is an instance of decides its status.
STATUS_BY_ERROR: list[tuple[type[KilnError], int]] = [
    (Unauthorized, 401),
    (NotFound, 404),
    (Conflict, 409),
    (PayloadTooLarge, 413),
    (ModelTooLarge, 413),
    (ImportTimeout, 422),
    (InvalidModel, 422),
    (UnsupportedOperator, 422),
    (MissingInputShape, 422),
    (InvalidSpec, 422),
    (MissingDependency, 422),
    (TooManyRequests, 429),
    (TuningFailed, 500),
    (DeviceUnavailable, 503),
    (SchemaOutdated, 503),
]


def status_for(error: KilnError) -> int:
    """The HTTP status code of a Kiln error (400 for any error without a more fitting one)."""
    for cls, status in STATUS_BY_ERROR:
        if isinstance(error, cls):
            return status
    return 400


def error_body(kind: str, message: str) -> dict[str, dict[str, str]]:
    """The JSON body of every error response."""
    return {"error": {"kind": kind, "message": message}}


def error_response(kind: str, message: str, status: int) -> JSONResponse:
    """An error response; 401 ones say which scheme to use."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_body(kind, message), status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError, most: int = 5) -> str:
    """The first few problems, each cut short: a message never grows with what the client sent."""
    errors = exc.errors()
    parts = []
    for err in errors[:most]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path"))
        parts.append(f"{where[:100] or 'request'}: {str(err.get('msg', 'invalid'))[:200]}")
    more = f"; and {len(errors) - most} more" if len(errors) > most else ""
    return ("; ".join(parts) or "invalid request") + more


def install_error_handlers(app: FastAPI) -> None:
    """Map Kiln errors, validation errors, HTTP errors and bugs to the one error format."""

    @app.exception_handler(KilnError)
    async def _kiln_error(_request: Request, exc: KilnError) -> JSONResponse:
        return error_response(exc.kind, exc.message, status_for(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response("invalid_request", _validation_message(exc), 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(kind, str(exc.detail), exc.status_code)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response("internal_error", f"{type(exc).__name__}: {exc}", 500)
