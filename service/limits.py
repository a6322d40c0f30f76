"""Request body limit: an oversized upload is answered 413 without reading it into memory."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import error_response


class BodySizeLimit:
    """ASGI middleware: refuse bodies over ``max_bytes`` (declared or actually streamed) with 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> Any:
        mib = self.max_bytes / (1 << 20)
        return error_response(
            "payload_too_large",
            f"the request body is larger than this server accepts ({mib:g} MiB; KILN_MAX_UPLOAD_MB)",
            413,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large()(scope, receive, send)
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
                if received > self.max_bytes:
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
                await self._too_large()(scope, receive, send)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
            if not replied:
                replied = True
                await self._too_large()(scope, receive, send)
