"""What a test run must have, so that a missing extra or CPU feature fails the run instead of skipping tests.

``KILN_TEST_REQUIRE`` lists, comma-separated, the modules the run needs importable (``torch``, ``jax``,
``playwright``...) and the CPU flags it needs, as ``/proc/cpuinfo`` spells them, prefixed ``cpu:``
(``cpu:avx2``). ``.ci/run`` sets it to what CI is meant to cover; a local ``make test`` leaves it unset, and
the tests that need what is missing skip, saying why.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable

from kiln_tvm.host_cpu import cpu_flags

REQUIRE_ENV = "KILN_TEST_REQUIRE"
CPU_PREFIX = "cpu:"


def required_by_environment() -> list[str]:
    """The names ``KILN_TEST_REQUIRE`` lists (none when it is unset)."""
    return [name.strip() for name in os.environ.get(REQUIRE_ENV, "").split(",") if name.strip()]


def missing_requirements(required: Iterable[str], flags: frozenset[str] | None = None) -> list[str]:
    """Of ``required``, what this run lacks, each saying what it is (``flags``: this CPU's, by default)."""
    flags = cpu_flags() if flags is None else flags
    missing = []
    for name in required:
        if name.startswith(CPU_PREFIX):
            flag = name.removeprefix(CPU_PREFIX)
            if flag not in flags:
                missing.append(f"CPU flag {flag!r} (not in /proc/cpuinfo)")
        elif importlib.util.find_spec(name) is None:
            missing.append(f"module {name!r} (not installed: its extra is missing from this environment)")
    return missing
