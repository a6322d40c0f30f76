"""Blocking work that stops when its HTTP client goes away (model imports and previews in the sandbox)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import anyio
from anyio import to_thread
from fastapi import Request

T = TypeVar("T")

# How often a waiting request looks whether its client is still there.
_DISCONNECT_POLL_S = 0.5
# Threads that only wait for a sandboxed child: many may wait at once without taking the threads that
# serve the rest of the API (FastAPI's default pool has 40).
_WAITERS = anyio.CapacityLimiter(256)


async def while_connected(request: Request, work: Callable[[Callable[[], bool]], T]) -> T:
    """Run ``work(client_gone)`` in a thread; ``client_gone()`` turns true once the client disconnects."""
    gone = threading.Event()

    async def watch() -> None:
        while not gone.is_set():
            if await request.is_disconnected():
                gone.set()
                return
            await anyio.sleep(_DISCONNECT_POLL_S)

    outcome: list[T] = []
    failure: list[BaseException] = []
    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        try:
            outcome.append(await to_thread.run_sync(work, gone.is_set, limiter=_WAITERS))
        except Exception as exc:  # raised below, outside the task group (which would wrap it in a group)
            failure.append(exc)
        finally:
            group.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return outcome[0]
