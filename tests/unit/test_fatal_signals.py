"""A process that runs TVM dies at once on a fatal signal, with its Python stacks, through faulthandler."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

_CRASH = """
import os, signal, sys
from tuner.isolation.fatal_signals import report_fatal_signals
report_fatal_signals(sys.stderr)
def deep_in_the_search():
    os.kill(os.getpid(), signal.{name})
deep_in_the_search()
"""


@pytest.mark.parametrize("name", ["SIGSEGV", "SIGBUS", "SIGFPE", "SIGABRT"])
def test_fatal_signal_ends_the_process_with_python_stacks(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CRASH.format(name=name)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -getattr(signal, name), done.stderr
    assert "Fatal Python error" in done.stderr
    assert "deep_in_the_search" in done.stderr  # the Python stack of the thread that got it
    # TVM-FFI's handler (which allocates and locks inside the handler, and so can hang) did not run.
    assert "Segfault encountered" not in done.stderr
