"""Talking to TVM's RPC tracker: addresses, device queues, and checks that a runner's device is there.

A remote runner (a :class:`~tuner.entities.RunnerSpec` of kind ``rpc``, tracker ``host:port``, key ``K``)
measures candidates on whichever server registered itself at that tracker under key ``K``. TVM's own client waits for the
tracker without bound (it retries refused connections for a minute, and then blocks on the reply), and
a measurement request for a key with no server queues forever; everything here is bounded instead.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

from kiln_tvm import rpc_base, tvm_ffi
from tuner.entities import RunnerSpec
from tuner.errors import DeviceUnavailable, InvalidSpec
from tuner.rpc.address import parse_tracker, validate_runner

DEFAULT_SESSION_TIMEOUT_S = 60  # one candidate's RPC session: upload, link, load, run, clean up
DEFAULT_QUEUE_TIMEOUT_S = 60.0  # how long a candidate may wait for a busy server of its key
DEFAULT_CHECK_TIMEOUT_S = 10.0  # one question to the tracker

# Raised inside the runner, DeviceUnavailable crosses MetaSchedule's C++ task scheduler: registered,
# it comes out of ``tune_tasks`` as itself instead of a RuntimeError.
tvm_ffi.register_error("kiln.DeviceUnavailable", DeviceUnavailable)


@dataclass(frozen=True)
class DeviceQueue:
    """The devices registered at a tracker under one key."""

    key: str
    free: int  # idle servers, ready for a session
    pending: int  # session requests waiting for a server
    total: int  # servers registered (idle or busy)


def query_tracker(address: str, timeout_s: float) -> dict[str, Any]:
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


def server_key(info: dict[str, Any]) -> str:
    """The key a server registered under (the tracker lists it as ``server:<key>``)."""
    return str(info.get("key", "")).partition(":")[2]  # servers register as "server:<key>"


def tracker_summary(address: str, timeout_s: float) -> list[DeviceQueue]:
    """The device queues of a tracker, by key; raises ``DeviceUnavailable`` when it cannot be asked."""
    raw = query_tracker(address, timeout_s)
    totals: dict[str, int] = {}
    for info in raw.get("server_info", []):
        key = server_key(info)
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


def allowed_tracker(asked: str | None, configured: list[str]) -> str:
    """The tracker a job submitted over the API measures through: the one it names if the operator
    configured it, else the first configured. A job picks a device, not an address: a tracker field that
    any user could point anywhere made the worker connect to any host and port."""
    if not configured:
        raise InvalidSpec(
            "this server has no RPC tracker configured (KILN_RPC_TRACKER, KILN_RPC_TRACKERS): jobs measure "
            "on its workers' CPUs (runner 'local')"
        )
    if asked is None:
        return configured[0]
    if asked not in configured:
        raise InvalidSpec(
            f"RPC tracker '{asked[:100]}' is not one this server uses ({', '.join(configured)}); pick a device "
            "key at one of them (GET /api/v1/devices), or leave the tracker out"
        )
    return asked


def check_runner(runner: RunnerSpec, timeout_s: float) -> DeviceQueue | None:
    """Fail fast when a job's runner cannot measure: tracker unreachable, or no server with its key.

    Returns the tracker's queue for the runner's key (``None`` for the local runner)."""
    if runner.is_local:
        return None
    validate_runner(runner)
    tracker, key = runner.tracker, runner.key
    queues = tracker_summary(tracker, timeout_s)
    queue = next((q for q in queues if q.key == key and q.total > 0), None)
    if queue is None:
        known = ", ".join(f"'{q.key}'" for q in queues if q.total) or "none"
        raise DeviceUnavailable(
            f"no RPC server with key '{key}' is registered at tracker {tracker} (registered keys: {known}); "
            f"start one with `kiln rpc server --tracker {tracker} --key {key}`"
        )
    return queue
