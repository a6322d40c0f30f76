"""A heartbeat kept fresh from a background thread: ``with Heartbeat(beat, interval_s, name):``.

Jobs and task groups are taken for abandoned when their heartbeat goes stale, so whatever holds one beats
while it works, even while it waits on something slow (a tuning process starting, a long batch)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Heartbeat:
    """Calls ``beat`` every ``interval_s`` (``immediately`` too, if asked) until the block ends, or until
    ``beat`` returns False: what it beats is no longer its holder's, and ``lost`` says so. A beat that
    raises (a database hiccup) is logged and the next one retries."""

    def __init__(
        self, beat: Callable[[], bool], interval_s: float, name: str, *, immediately: bool = False
    ) -> None:
        self.beat, self.interval_s, self.name, self.immediately = beat, interval_s, name, immediately
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        if self.immediately and not self._beat_once():
            return
        while not self._stop.wait(self.interval_s):
            if not self._beat_once():
                return

    def _beat_once(self) -> bool:
        try:
            if not self.beat():
                self.lost = True
                return False
        except Exception:
            log.exception("%s failed; retrying", self.name)
        return True

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
