"""How much of this machine's CPUs other processes used while Kiln measured something: a figure taken
while they were busy is off, and the caller says so or takes it again."""

from __future__ import annotations

import os
import time

#: Other processes using more than this share of all CPUs while Kiln measured: the figure may be off.
BUSY_CPU_SHARE = 0.25


class OtherCpuSampler:
    """How much of all CPUs processes other than this one and its children used since it was made.

    Reads the machine's busy time from ``/proc/stat`` and subtracts this process's own CPU time, that of
    its finished children, and what the caller says its other helpers used (the timing children are the
    fork server's, not this process's); None where ``/proc/stat`` cannot be read (not Linux).
    """

    def __init__(self) -> None:
        self._start = (time.monotonic(), _machine_busy_s(), _own_cpu_s())

    def share(self, helpers_cpu_s: float = 0.0) -> float | None:
        """The share of all CPUs used by others, ``helpers_cpu_s`` (CPU seconds of this process's helpers
        that are not its children) not counted."""
        wall0, busy0, own0 = self._start
        busy1 = _machine_busy_s()
        if busy0 is None or busy1 is None:
            return None
        wall = time.monotonic() - wall0
        cpus = os.cpu_count() or 1
        if wall <= 0:
            return 0.0
        other = (busy1 - busy0) - (_own_cpu_s() - own0) - helpers_cpu_s
        return min(1.0, max(0.0, other / (wall * cpus)))


def _machine_busy_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal: everything but idle and iowait is busy.
    values = [int(v) for v in fields[1:9]]
    busy = sum(values) - values[3] - values[4]
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
