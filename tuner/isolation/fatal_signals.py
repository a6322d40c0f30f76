"""Fatal signals in a process that runs TVM: die at once with a Python stack, never hang.

Loading ``libtvm_ffi`` installs a SIGSEGV handler that builds a native backtrace inside the handler:
it allocates memory and takes a mutex. When the signal lands on a thread that holds the allocator's lock
or that mutex (MetaSchedule's search threads allocate constantly; every TVM error builds a backtrace),
the handler waits for itself and the process hangs instead of dying. For a job that is the worst
outcome: its worker keeps waiting, and the job stays "running" with nothing happening.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
from typing import TextIO


def report_fatal_signals(stream: TextIO) -> None:
    """Make SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT write every thread's Python stack to ``stream``
    and end the process with that signal, replacing TVM-FFI's SIGSEGV handler.

    Call it after TVM is imported (importing TVM installs the handler being replaced). ``stream`` must
    stay open for the life of the process. faulthandler only writes to a file descriptor in its handler,
    then re-raises the signal with the default action.
    """
    import kiln_tvm  # noqa: F401  (loads libtvm_ffi, whose constructor installs its handler)

    # faulthandler re-raises with the handler it found; make that the default action, not TVM's.
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    faulthandler.enable(file=stream, all_threads=True)


def report_fatal_signals_on_stderr() -> None:
    """:func:`report_fatal_signals` to this process's stderr (an initializer for TVM's worker pools)."""
    report_fatal_signals(sys.stderr)
