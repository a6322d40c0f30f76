"""TVM's RPC tracker and device servers as processes Kiln starts, supervises and stops."""

from __future__ import annotations

import functools
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kiln_tvm import RPCServer, RPCTracker
from tuner.errors import Conflict, DeviceUnavailable, InvalidSpec
from tuner.rpc.address import parse_tracker
from tuner.rpc.device_info import register_device_functions
from tuner.rpc.tracker import (
    DEFAULT_CHECK_TIMEOUT_S,
    query_tracker,
    server_key,
    tracker_summary,
)

log = logging.getLogger(__name__)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class RPCProcess:
    """A TVM RPC tracker or server running in a child process (TVM spawns it)."""

    def __init__(self, handle: Any, role: str, host: str, port: int) -> None:
        self._handle = handle
        self.role = role
        self.host = host
        self.port = port

    @property
    def address(self) -> str:
        """``host:port`` it listens on."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The child process's id (its sessions' processes are its children), or None once stopped."""
        proc = getattr(getattr(self._handle, "proc", None), "_proc", None)
        return int(proc.pid) if proc is not None else None

    def is_alive(self) -> bool:
        """Whether the child process still runs."""
        proc = getattr(self._handle, "proc", None)
        return bool(proc is not None and proc.is_alive())

    def terminate(self) -> None:
        """Stop the process and its children (a server forks one per session); idempotent."""
        proc = getattr(self._handle, "proc", None)
        if proc is not None:
            # PopenWorker.kill kills the children first. (Tracker.terminate would instead connect to
            # 127.0.0.1 to ask it to stop, which fails for a tracker bound to another address.)
            proc.kill()
            self._handle.proc = None

    def __enter__(self) -> RPCProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()

    def __repr__(self) -> str:
        return f"RPCProcess({self.role} at {self.address})"


def _start(role: str, host: str, port: int, start: Callable[[int], Any]) -> RPCProcess:
    port = port or _free_port(host)
    try:
        handle = start(port)
    except ValueError:  # TVM: "cannot bind to any port in [port, port_end)", with the child's traceback
        raise Conflict(f"cannot start the RPC {role} on {host}:{port}: the port is in use") from None
    except OSError as exc:
        raise Conflict(f"cannot start the RPC {role} on {host}:{port}: {exc.strerror or exc}") from None
    return RPCProcess(handle, role, host, int(handle.port))


def start_tracker(host: str = "127.0.0.1", port: int = 9190, silent: bool = True) -> RPCProcess:
    """Start a TVM RPC tracker on ``host:port`` (port 0: a free one) in a child process."""
    return _start(
        "tracker", host, port, lambda p: RPCTracker(host=host, port=p, port_end=p + 1, silent=silent)
    )


def _registered(tracker: str, key: str, port: int, timeout_s: float) -> bool:
    raw = query_tracker(tracker, timeout_s)
    return any(
        server_key(info) == key and list(info.get("addr", []))[1:2] == [port]
        for info in raw.get("server_info", [])
    )


def start_server(
    tracker: str,
    key: str,
    host: str = "127.0.0.1",
    port: int = 9090,
    *,
    silent: bool = True,
    timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
    tracker_wait_s: float = 0.0,
) -> RPCProcess:
    """Start a TVM RPC server on ``host:port`` (port 0: a free one) and register it at the tracker.

    Returns once the tracker lists the server; raises ``DeviceUnavailable`` when the tracker cannot be
    reached within ``tracker_wait_s`` (a tracker and its servers started together, as in
    docker-compose.yml, come up in any order; TVM's server would retry silently for a minute, then stop
    serving while still running).
    """
    if not key or ":" in key or any(c.isspace() for c in key):
        raise InvalidSpec(f"an RPC key must be a non-empty word without ':' or spaces, got {key!r}")
    tracker_host, tracker_port = parse_tracker(tracker)
    wait_for_tracker(tracker, tracker_wait_s, timeout_s)
    process = _start(
        "server",
        host,
        port,
        lambda p: RPCServer(
            host=host,
            port=p,
            port_end=p + 1,
            tracker_addr=(tracker_host, tracker_port),
            key=key,
            silent=silent,
            # Kiln's servers answer what a job asks of its device (its caches, for cpu-poly) and their
            # name (which server measured a candidate).
            server_init_callback=functools.partial(register_device_functions, f"{host}:{p}"),
        ),
    )
    deadline = time.monotonic() + timeout_s
    while not _registered(tracker, key, process.port, timeout_s):
        if time.monotonic() > deadline or not process.is_alive():
            process.terminate()
            raise DeviceUnavailable(
                f"the RPC server on {process.address} did not register at tracker {tracker} "
                f"within {timeout_s:g} s"
            )
        time.sleep(0.1)
    return process


def wait_for_tracker(tracker: str, wait_s: float, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> None:
    """Return once the tracker answers, trying again for up to ``wait_s`` seconds (every second, saying so
    once); ``DeviceUnavailable`` with the last reason after that."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            tracker_summary(tracker, timeout_s)
            return
        except DeviceUnavailable as exc:
            if time.monotonic() + 1.0 > deadline:
                if wait_s > 0:
                    raise DeviceUnavailable(f"{exc.message} (tried for {wait_s:g} s)") from None
                raise
            if not said:
                log.warning("%s; trying again for up to %g s", exc.message, wait_s)
                said = True
            time.sleep(1.0)


def stop_on_sigterm() -> threading.Event:
    """An event set by SIGTERM. Install it before starting a process, so that no SIGTERM is lost."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    return stop


def run_until_stopped(
    process: RPCProcess,
    *,
    tracker: str | None = None,
    key: str | None = None,
    check_every_s: float = 10.0,
    timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
    stop: threading.Event | None = None,
) -> None:
    """Keep a tracker or server running until Ctrl-C or SIGTERM, then stop it.

    For a server (``tracker`` and ``key`` given) it also watches the registration: TVM's server stops
    serving for good, while its process stays up, after its tracker has been unreachable for a
    minute. Three failed checks in a row raise ``DeviceUnavailable``, so a supervisor can restart it.
    """
    if stop is None:  # the caller did not install a SIGTERM handler before starting the process
        stop = stop_on_sigterm()
    misses = 0
    next_check = time.monotonic() + check_every_s
    try:
        while not stop.is_set():
            if not process.is_alive():
                raise DeviceUnavailable(f"the RPC {process.role} on {process.address} exited unexpectedly")
            if tracker and key and time.monotonic() >= next_check:
                next_check = time.monotonic() + check_every_s
                try:
                    ok = _registered(tracker, key, process.port, timeout_s)
                except DeviceUnavailable as exc:
                    log.warning("%s", exc.message)
                    ok = False
                misses = 0 if ok else misses + 1
                if misses >= 3:
                    raise DeviceUnavailable(
                        f"the RPC server on {process.address} has not been registered at tracker "
                        f"{tracker} for {3 * check_every_s:g} s; restart it"
                    )
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        process.terminate()
