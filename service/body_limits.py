"""Request body limits: an oversized body is answered 413 without reading it into memory.

A model upload may be large (``KILN_MAX_UPLOAD_MB``); every other body is JSON a few hundred bytes long, and
parsing one into Python objects costs ~50x its size (a 50 MB job body once took the server from 0.6 to
3 GB), so everything but an upload is held to ``KILN_MAX_JSON_KB``.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import error_response

#: The routes that take a large body: POST a model file, POST a calibration file.
UPLOAD_PATH = "/api/v1/models"
CALIBRATION_PATH = "/api/v1/calibrations"


class BodySizeLimit:
    """ASGI middleware: refuse bodies over the request's limit (declared or actually streamed) with 413:
    ``upload_bytes`` for a model upload, ``calibration_bytes`` for a calibration file (default: as a model),
    ``json_bytes`` for any other request."""

    def __init__(
        self, app: ASGIApp, upload_bytes: int, json_bytes: int, calibration_bytes: int | None = None
    ) -> None:
        self.app = app
        self.upload_bytes = upload_bytes
        self.json_bytes = json_bytes
        self.calibration_bytes = upload_bytes if calibration_bytes is None else calibration_bytes

    def _limit(self, scope: Scope) -> tuple[int, str]:
        path = scope.get("path", "").rstrip("/")
        if scope.get("method") == "POST" and path == UPLOAD_PATH:
            return self.upload_bytes, f"{self.upload_bytes / (1 << 20):g} MiB for a model; KILN_MAX_UPLOAD_MB"
        if scope.get("method") == "POST" and path == CALIBRATION_PATH:
            limit = self.calibration_bytes
            return limit, f"{limit / (1 << 20):g} MiB for a calibration file; KILN_MAX_CALIBRATION_MB"
        return self.json_bytes, f"{self.json_bytes / 1024:g} KiB for this request; KILN_MAX_JSON_KB"

    def _too_large(self, what: str) -> Any:
        return error_response(
            "payload_too_large", f"the request body is larger than this server accepts ({what})", 413
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes, what = self._limit(scope)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await self._too_large(what)(scope, receive, send)
            return

        received = 0
        exceeded = False
        replied = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            if exceeded:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    # Stop reading; whatever the app answers to the cut-off body is replaced below.
                    exceeded = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal replied
            if not exceeded:
                await send(message)
                return
            if not replied:
                replied = True
                await self._too_large(what)(scope, receive, send)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
            if not replied:
                replied = True
                await self._too_large(what)(scope, receive, send)
