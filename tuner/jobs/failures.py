"""Why a job failed, in one sentence a user can act on; the details stay on the worker.

What a user sees of a failure (the API's ``error``, ``kiln status``, the dashboard's job page and Jobs list)
is a reason, never a traceback or a path on the server: "onnxruntime is not installed on the worker: ...",
"the tuning process was killed by SIGILL ...". The traceback goes to the job's crash report
(``crash.txt`` in the job's directory on the worker, beside the thread stacks a fatal signal writes there),
where whoever runs the worker can read it.
"""

from __future__ import annotations

import errno
import re
import traceback
from datetime import datetime, timezone
from pathlib import Path

from forkserver import ForkServerUnavailable
from tuner.errors import KilnError

#: The file in a job's directory that holds what a user is not shown: tracebacks and fatal signals' stacks.
CRASH_REPORT = "crash.txt"
#: Where a user is told the details are (a name, not the worker's path).
DETAILS_HINT = f"the details are in {CRASH_REPORT} in the job's directory on the worker"

_MAX_CHARS = 300
# An absolute path of two or more parts, not part of a URL or of a longer word.
_PATH = re.compile(r"(?<![\w.:/~-])/(?:[\w.+@~-]+/)+([\w.+@~-]*)")
# What pip installs for a module that a job can miss (the rest install under their own name).
_PIP_NAMES = {
    "onnxruntime": "onnxruntime",
    "torch": "'kiln-autotune[torch]'",
    "jax": "'kiln-autotune[jax]'",
    "jaxlib": "'kiln-autotune[jax]'",
}
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def crash_report_path(jobs_dir: Path, job_id: str) -> Path:
    """Where a job's process writes what a user is not shown (tracebacks, fatal signals' stacks)."""
    return jobs_dir / job_id / CRASH_REPORT


def without_paths(text: str) -> str:
    """``text`` with every absolute path on this machine cut to its last part (``/srv/a/b.py`` -> ``b.py``)."""
    return _PATH.sub(lambda m: m.group(1) or "…", text)


def describe_failure(exc: BaseException, stage: str | None = None) -> str:
    """One sentence saying why a job failed with ``exc`` while in ``stage``, without server paths."""
    during = f" while {stage}" if stage else ""
    if isinstance(exc, KilnError):
        return without_paths(exc.message)
    module = missing_module(exc)
    if module is not None:
        package = _PIP_NAMES.get(module.split(".")[0], module.split(".")[0])
        return (
            f"{module} is not installed on the worker, and the job needs it{during}: install it there "
            f"(pip install {package}) and submit the job again"
        )
    if isinstance(exc, ForkServerUnavailable):
        return _short(
            f"a helper process of the job could not be started{during}: {_last_line(exc)}; {DETAILS_HINT}"
        )
    if isinstance(exc, MemoryError):
        return f"the worker ran out of memory{during}; give the worker more memory or tune a smaller model"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"the worker's disk is full{during}: free space in its data directory and submit the job again"
    first = _last_line(exc)
    what = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return _short(f"an internal error ended the job{during} ({what}); {DETAILS_HINT}")


def missing_module(exc: BaseException) -> str | None:
    """The module whose absence caused ``exc`` (itself, a cause, or a helper process's last words), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ModuleNotFoundError) and current.name:
            return current.name
        match = _MISSING_MODULE.search(str(current))
        if match:
            return match.group(1)
        current = current.__cause__ or current.__context__
    return None


def write_crash_report(path: Path, exc: BaseException, stage: str | None = None) -> None:
    """Append ``exc``'s traceback to the crash report at ``path`` (a failure to write it is not an error)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            when = datetime.now(timezone.utc).isoformat(timespec="seconds")
            out.write(f"--- {when}: the job failed{f' while {stage}' if stage else ''}\n")
            out.write("".join(traceback.format_exception(exc)))
    except OSError:
        pass


def _last_line(exc: BaseException) -> str:
    """The last non-empty line of ``exc``'s message (a helper's traceback ends with its error), no paths."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return without_paths(lines[-1]) if lines else ""


def _short(text: str) -> str:
    return text if len(text) <= _MAX_CHARS else text[: _MAX_CHARS - 1] + "…"
