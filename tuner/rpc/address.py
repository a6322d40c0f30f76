"""An RPC tracker's address, checked without TVM (a job's spec is checked before TVM loads)."""

from __future__ import annotations

from tuner.entities import RunnerSpec
from tuner.errors import InvalidSpec


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


def validate_runner(runner: RunnerSpec) -> None:
    """Check what a runner spec's own fields cannot: that an rpc runner's tracker is a host:port."""
    if not runner.is_local:
        parse_tracker(runner.tracker)
