"""What Kiln asks a remote device about itself: its data caches, through a function Kiln's RPC servers
register (``kiln rpc server``). A plain TVM server does not have it; the caller then falls back to the
settings."""

from __future__ import annotations

import logging
import threading
from typing import Any

from kiln_tvm import tvm
from schedules.poly.caches import CacheHierarchy, parse_cache_spec, read_sysfs_caches
from tuner.entities import RunnerSpec
from tuner.errors import KilnError
from tuner.rpc.address import parse_tracker
from tuner.rpc.tracker import tracker_summary

log = logging.getLogger(__name__)

#: The global function of Kiln's RPC servers that answers the device's cache sizes as a spec.
CACHE_SIZES_FUNC = "kiln.device.cache_sizes"
#: The global function of Kiln's RPC servers that answers the server's name (the ``host:port`` it serves).
SERVER_NAME_FUNC = "kiln.device.server"
#: The name of a server that does not say (a plain TVM one).
UNNAMED_SERVER = "?"


def _cache_sizes() -> str:
    return read_sysfs_caches().to_spec()


def register_device_functions(server: str = UNNAMED_SERVER) -> None:
    """Register the functions Kiln asks a device for: run in the RPC server's process at its start;
    ``server`` is the name it answers with."""
    tvm.register_global_func(CACHE_SIZES_FUNC, _cache_sizes, override=True)
    tvm.register_global_func(SERVER_NAME_FUNC, lambda: server, override=True)


def server_name(session: Any) -> str:
    """The name of the server behind an RPC ``session`` (:data:`UNNAMED_SERVER` when it does not say)."""
    try:
        return str(session.get_function(SERVER_NAME_FUNC)())
    except Exception:  # noqa: BLE001 - a server that is not Kiln's has no such function
        return UNNAMED_SERVER


def device_caches(runner: RunnerSpec, timeout_s: float) -> CacheHierarchy | None:
    """The caches the device behind ``runner`` reports, or None when it cannot say within ``timeout_s``
    (no free server in time, or a server that is not Kiln's)."""
    host, port = parse_tracker(runner.tracker)
    # Only a free server is asked: a request for a busy key would wait at the tracker, holding its place.
    try:
        free = any(q.key == runner.key and q.free > 0 for q in tracker_summary(runner.tracker, timeout_s))
    except KilnError as exc:
        log.info("the device '%s' did not report its caches (%s)", runner.key, exc.message)
        return None
    if not free:
        log.info("the device '%s' did not report its caches: no free server", runner.key)
        return None
    found: list[str] = []
    errors: list[str] = []

    def ask() -> None:
        try:
            session = tvm.rpc.connect_tracker(host, port).request(
                runner.key, session_timeout=timeout_s, max_retry=1
            )
            found.append(str(session.get_function(CACHE_SIZES_FUNC)()))
            del session  # hands the server back to the tracker now, for the job's measurements
        except Exception as exc:  # noqa: BLE001 - any failure means "the device did not say"
            errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0])

    # The tracker holds a request until a server is free: wait for it no longer than the timeout.
    thread = threading.Thread(target=ask, daemon=True, name="kiln-device-caches")
    thread.start()
    thread.join(timeout_s)
    if not found:
        reason = errors[0] if errors else f"no free server within {timeout_s:g} s"
        log.info("the device '%s' did not report its caches (%s)", runner.key, reason)
        return None
    spec = found[0]
    return parse_cache_spec(spec, source="rpc device") if spec else None
