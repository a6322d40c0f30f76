"""Talking to TVM's RPC tracker and servers: device queues, runner checks, tracker/server processes.

A remote runner is ``{"kind": "rpc", "tracker": "host:port", "key": "K"}``: candidates are measured on
whichever server registered itself at that tracker under key ``K``. TVM's own client waits for the
tracker without bound (it retries refused connections for a minute, and then blocks on the reply), and
a measurement request for a key with no server queues forever; everything here is bounded instead.
"""

from __future__ import annotations

import logging
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kiln_tvm import (
    PopenPoolExecutor,
    RPCServer,
    RPCTracker,
    derived_object,
    ms,
    rpc_base,
    tvm_ffi,
)
from tuner.errors import Conflict, DeviceUnavailable, InvalidSpec
from tuner.runner import DoneFuture

log = logging.getLogger(__name__)

DEFAULT_SESSION_TIMEOUT_S = 60  # one candidate's RPC session: upload, link, load, run, clean up
DEFAULT_QUEUE_TIMEOUT_S = 60.0  # how long a candidate may wait for a busy server of its key
DEFAULT_CHECK_TIMEOUT_S = 10.0  # one question to the tracker

# Raised inside the runner, DeviceUnavailable crosses MetaSchedule's C++ task scheduler: registered,
# it comes out of ``tune_tasks`` as itself instead of a RuntimeError.
tvm_ffi.register_error("kiln.DeviceUnavailable", DeviceUnavailable)


def parse_tracker(address: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``; ``[::1]:9190`` is accepted for IPv6."""
    host, sep, port = str(address).strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidSpec(
            f"an RPC tracker address must be host:port with a port in 1-65535 (e.g. 127.0.0.1:9190), "
            f"got {address!r}"
        )
    return host, int(port)


@dataclass(frozen=True)
class DeviceQueue:
    """The devices registered at a tracker under one key."""

    key: str
    free: int  # idle servers, ready for a session
    pending: int  # session requests waiting for a server
    total: int  # servers registered (idle or busy)


def _query_tracker(address: str, timeout_s: float) -> dict[str, Any]:
    """The tracker's raw summary: ``{"queue_info": {key: {"free", "pending"}}, "server_info": [...]}``.

    Speaks the tracker protocol over a socket whose every step shares one deadline, unlike TVM's
    ``connect_tracker``.
    """
    host, port = parse_tracker(address)
    deadline = time.monotonic() + timeout_s

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left

    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except TimeoutError:
        raise DeviceUnavailable(
            f"the RPC tracker at {address} did not accept a connection within {timeout_s:g} s"
        ) from None
    except OSError as exc:
        raise DeviceUnavailable(
            f"cannot reach the RPC tracker at {address} ({exc.strerror or exc}); "
            f"start one with `kiln rpc tracker --host {host} --port {port}`"
        ) from None
    magic = rpc_base.RPC_TRACKER_MAGIC
    try:
        with sock:
            sock.settimeout(remaining())
            sock.sendall(struct.pack("<i", magic))
            if struct.unpack("<i", rpc_base.recvall(sock, 4))[0] != magic:
                raise ValueError("wrong handshake")
            sock.settimeout(remaining())
            rpc_base.sendjson(sock, [rpc_base.TrackerCode.SUMMARY])
            reply = rpc_base.recvjson(sock)
    except TimeoutError:
        raise DeviceUnavailable(
            f"{address} did not answer as a TVM RPC tracker within {timeout_s:g} s "
            "(is it the tracker's port?)"
        ) from None
    except (OSError, ValueError, struct.error) as exc:
        raise DeviceUnavailable(f"{address} is not a TVM RPC tracker ({exc})") from None
    if (
        not isinstance(reply, list)
        or len(reply) != 2
        or reply[0] != rpc_base.TrackerCode.SUCCESS
        or not isinstance(reply[1], dict)
    ):
        raise DeviceUnavailable(f"the RPC tracker at {address} sent an unexpected summary: {reply!r:.200}")
    return reply[1]


def _server_key(info: dict[str, Any]) -> str:
    return str(info.get("key", "")).partition(":")[2]  # servers register as "server:<key>"


def tracker_summary(address: str, timeout_s: float) -> list[DeviceQueue]:
    """The device queues of a tracker, by key; raises ``DeviceUnavailable`` when it cannot be asked."""
    raw = _query_tracker(address, timeout_s)
    totals: dict[str, int] = {}
    for info in raw.get("server_info", []):
        key = _server_key(info)
        totals[key] = totals.get(key, 0) + 1
    queues = raw.get("queue_info", {})
    queue_list = []
    for key in sorted(set(queues) | set(totals)):
        queue = queues.get(key, {})
        queue_list.append(
            DeviceQueue(
                key=key,
                free=int(queue.get("free", 0)),
                pending=int(queue.get("pending", 0)),
                total=totals.get(key, 0),
            )
        )
    # The tracker keeps a key's (empty) queue after its last server left: not a device any more.
    return [q for q in queue_list if q.total or q.free or q.pending]


def validate_runner(runner: dict[str, Any]) -> tuple[str, str] | None:
    """Check a runner spec's shape: ``{"kind": "local"}``, or ``{"kind": "rpc", "tracker", "key"}``.

    Returns ``(tracker, key)`` of an rpc runner, None for the local one.
    """
    kind = runner.get("kind", "local") if isinstance(runner, dict) else None
    if kind == "local":
        return None
    if kind != "rpc":
        raise InvalidSpec(f"unknown runner {runner!r}; use {{'kind': 'local'}} or {{'kind': 'rpc', ...}}")
    tracker = runner.get("tracker")
    key = runner.get("key")
    if not tracker or not key or not isinstance(key, str):
        raise InvalidSpec("an rpc runner needs 'tracker' (host:port) and a device 'key'")
    parse_tracker(str(tracker))
    return str(tracker), key


def check_runner(runner: dict[str, Any], timeout_s: float) -> None:
    """Fail fast when a job's runner cannot measure: tracker unreachable, or no server with its key."""
    fields = validate_runner(runner)
    if fields is None:
        return
    tracker, key = fields
    queues = tracker_summary(tracker, timeout_s)
    if not any(q.key == key and q.total > 0 for q in queues):
        known = ", ".join(f"'{q.key}'" for q in queues if q.total) or "none"
        raise DeviceUnavailable(
            f"no RPC server with key '{key}' is registered at tracker {tracker} (registered keys: {known}); "
            f"start one with `kiln rpc server --tracker {tracker} --key {key}`"
        )


@derived_object
class GuardedRPCRunner(ms.runner.PyRunner):
    """MetaSchedule's ``RPCRunner``, measuring one candidate at a time and failing when the device goes.

    Before each batch, and after each failed candidate, it asks the tracker whether a server with the
    key is still registered: a job whose device disappeared fails with ``DeviceUnavailable`` at once
    instead of timing out candidate after candidate. Waiting for each measurement also keeps the
    search's threads off the CPU while a server on this machine measures.
    """

    def __init__(self, inner: Any, runner: dict[str, Any], check_timeout_s: float) -> None:
        super().__init__()
        self.inner = inner
        self.runner = runner
        self.check_timeout_s = check_timeout_s

    def run(self, runner_inputs: list[Any]) -> list[Any]:
        check_runner(self.runner, self.check_timeout_s)
        futures = []
        for runner_input in runner_inputs:
            result = self.inner.run([runner_input])[0].result()
            if result.error_msg:
                check_runner(self.runner, self.check_timeout_s)
            futures.append(DoneFuture(result))
        return futures


def make_rpc_runner(runner: dict[str, Any], evaluator_config: Any) -> Any:
    """A MetaSchedule runner measuring on the servers behind a tracker, with every wait bounded.

    Optional runner fields: ``session_timeout_s`` (one candidate's session on the server, default 60),
    ``queue_timeout_s`` (waiting for a busy server, default 60), ``timeout_s`` (a question to the
    tracker, default 10).
    """
    fields = validate_runner(runner)
    if fields is None:
        raise InvalidSpec("make_rpc_runner needs an rpc runner spec")
    tracker, key = fields
    host, port = parse_tracker(tracker)
    session_timeout = int(runner.get("session_timeout_s", DEFAULT_SESSION_TIMEOUT_S))
    queue_timeout = float(runner.get("queue_timeout_s", DEFAULT_QUEUE_TIMEOUT_S))
    check_timeout = float(runner.get("timeout_s", DEFAULT_CHECK_TIMEOUT_S))
    if session_timeout < 1 or queue_timeout <= 0 or check_timeout <= 0:
        raise InvalidSpec("rpc runner timeouts must be positive")
    config = ms.runner.RPCConfig(
        tracker_host=host,
        tracker_port=port,
        tracker_key=key,
        session_timeout_sec=session_timeout,
    )
    inner = ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator_config, max_workers=1)
    # The stock pool has no timeout, and a request for a key whose servers are all gone or busy waits
    # at the tracker forever: bound each candidate by the session plus a wait for a free server. A
    # timed-out candidate becomes "RPCRunner: Timeout" and its worker process is replaced.
    inner.pool.shutdown()
    inner.pool = PopenPoolExecutor(max_workers=1, timeout=session_timeout + queue_timeout)
    return GuardedRPCRunner(inner, {"kind": "rpc", "tracker": tracker, "key": key}, check_timeout)


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
    raw = _query_tracker(tracker, timeout_s)
    return any(
        _server_key(info) == key and list(info.get("addr", []))[1:2] == [port]
        for info in raw.get("server_info", [])
    )


def start_server(
    tracker: str,
    key: str,
    host: str = "127.0.0.1",
    port: int = 9090,
    silent: bool = True,
    timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
) -> RPCProcess:
    """Start a TVM RPC server on ``host:port`` (port 0: a free one) and register it at the tracker.

    Returns once the tracker lists the server; raises ``DeviceUnavailable`` when the tracker cannot be
    reached (TVM's server would retry silently for a minute, then stop serving while still running).
    """
    if not key or ":" in key or any(c.isspace() for c in key):
        raise InvalidSpec(f"an RPC key must be a non-empty word without ':' or spaces, got {key!r}")
    tracker_host, tracker_port = parse_tracker(tracker)
    tracker_summary(tracker, timeout_s)
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


def stop_on_sigterm() -> threading.Event:
    """An event set by SIGTERM. Install it before starting a process, so that no SIGTERM is lost."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    return stop


def run_until_stopped(
    process: RPCProcess,
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
