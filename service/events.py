"""A job's event stream, shared: one database poll per job, whatever the number of its open streams.

Each stream of ``GET /jobs/{id}/events`` once polled the database itself, every half second, through the
request thread pool: 200 idle streams were 400 queries a second, and ``/healthz`` waited its turn behind
them (p50 1.1 s). Now the streams of a job subscribe to one :class:`JobFeed`, which polls on a small
executor of its own (never the request pool) while the job has a subscriber, and hands each subscriber the
latest snapshot; a user may hold a bounded number of streams open at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tuner.errors import TooManyRequests

log = logging.getLogger(__name__)

#: How often a job with open streams is read from the database.
EVENT_POLL_S = 0.5
#: What a feed hands its subscribers: ("progress" | "end", the job and its tasks as JSON text, serialized
#: once for all of them).
Event = tuple[str, str]
#: Reads a job's snapshot: (data, whether the job has finished).
Snapshot = Callable[[str], tuple[dict[str, Any], bool]]


class JobFeed:
    """One job's poll loop and its subscribers' mailboxes (each holds only the latest event)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.mailboxes: set[asyncio.Queue[Event]] = set()
        self.last: Event | None = None
        self.task: asyncio.Task[None] | None = None

    def post(self, event: Event) -> None:
        """Give every subscriber ``event``, replacing one it has not read yet."""
        self.last = event
        for box in self.mailboxes:
            with contextlib.suppress(asyncio.QueueEmpty):
                box.get_nowait()
            box.put_nowait(event)


class JobEvents:
    """Every open event stream of the server, by job; see the module docstring."""

    def __init__(self, snapshot: Snapshot, poll_s: float, max_per_owner: int) -> None:
        self._snapshot = snapshot
        self._poll_s = poll_s
        self._max_per_owner = max_per_owner
        self._feeds: dict[str, JobFeed] = {}
        self._open: Counter[str] = Counter()
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kiln-events")
        #: Database polls made so far (all jobs): what the streams cost, whatever their number.
        self.polls = 0

    def open_streams(self, owner: str | None = None) -> int:
        """Streams open now, of ``owner`` or of everyone."""
        return self._open[owner] if owner is not None else sum(self._open.values())

    def check_room(self, owner: str) -> None:
        """:class:`TooManyRequests` when ``owner`` already holds the most streams allowed."""
        if self._open[owner] >= self._max_per_owner:
            raise TooManyRequests(
                f"{self._open[owner]} event streams are open for this user, the most allowed "
                "(KILN_MAX_STREAMS_PER_USER); close one, or poll GET /api/v1/jobs/{id}"
            )

    @contextlib.asynccontextmanager
    async def subscribe(self, job_id: str, owner: str) -> AsyncIterator[asyncio.Queue[Event]]:
        """A mailbox of ``job_id``'s events for as long as the block runs (see :meth:`check_room`)."""
        self.check_room(owner)
        feed = self._feeds.get(job_id)
        if feed is None:
            feed = self._feeds[job_id] = JobFeed(job_id)
        box: asyncio.Queue[Event] = asyncio.Queue(maxsize=1)
        if feed.last is not None:
            box.put_nowait(feed.last)
        feed.mailboxes.add(box)
        self._open[owner] += 1
        if feed.task is None or feed.task.done():
            feed.task = asyncio.create_task(self._poll(feed), name=f"kiln-events-{job_id}")
        try:
            yield box
        finally:
            feed.mailboxes.discard(box)
            self._open[owner] -= 1
            if self._open[owner] <= 0:
                del self._open[owner]
            if not feed.mailboxes and self._feeds.get(job_id) is feed:
                del self._feeds[job_id]
                if feed.task is not None:
                    feed.task.cancel()

    async def _poll(self, feed: JobFeed) -> None:
        loop = asyncio.get_running_loop()
        news = None
        while feed.mailboxes:
            try:
                data, finished = await loop.run_in_executor(self._executor, self._snapshot, feed.job_id)
            except Exception:  # a database error: the streams wait for the next poll
                log.exception("polling job %s for its event streams failed; retrying", feed.job_id)
                await asyncio.sleep(self._poll_s)
                continue
            self.polls += 1
            if finished:
                feed.post(("end", json.dumps(data)))
                return
            # A heartbeat alone is not news for the client.
            changed = {**data, "job": {k: v for k, v in data["job"].items() if k != "heartbeat_at"}}
            if changed != news:
                feed.post(("progress", json.dumps(data)))
                news = changed
            await asyncio.sleep(self._poll_s)

    def close(self) -> None:
        """Stop every feed and the executor (the server is shutting down)."""
        for feed in self._feeds.values():
            if feed.task is not None:
                feed.task.cancel()
        self._feeds.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
