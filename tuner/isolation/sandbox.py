"""The model sandbox: everything that parses or transforms a user's model runs in a bounded child process.

A model file is untrusted input to large C++ code (protobuf, PyTorch, TVM's importers and passes): a
small file can ask for gigabytes (a ``ConstantOfShape`` folded into a constant), hours (a 50,000-node
chain), or crash the process. :class:`ModelSandbox` runs each such request (``inspect`` an upload,
``plan`` a preview) in a fresh interpreter of its own (``python -m tuner.isolation.sandbox_child``) with

- a memory limit (``RLIMIT_DATA``: the memory the request may allocate on top of the importer's runtime),
- a CPU-time limit (``RLIMIT_CPU``) and a wall-clock timeout,
- its own process group, killed when a limit is hit, when the caller gives up (the client went away),
  or when this process dies (the child exits when its stdin closes),

and at most ``KILN_IMPORT_CONCURRENCY`` of them at once. A child serves one request and exits, so no
state (TVM's global ``BlockBuilder`` stack, fragmented memory) passes from one model to the next. The
children are forked from one process per Kiln process that has loaded TVM once (:mod:`forkserver`),
so that a request does not pay the 5-10 s of loading TVM and PyTorch; ``KILN_IMPORT_WARM_PROCESSES``
(> 0) starts that process with the service rather than at the first upload.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import selectors
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil

from forkserver import ForkedProcess, ForkServer, ForkServerUnavailable, shared_fork_server
from tuner.errors import ImporterCrashed, ImportTimeout, KilnError, ModelTooLarge, rebuild_error
from tuner.frontend.pt2_archive import WEIGHTS_ONLY_ENV
from tuner.settings import Settings

log = logging.getLogger(__name__)

_POLL_S = 0.2
# The most of a child's stderr kept for the log when it crashes.
_STDERR_TAIL = 4000


class Cancelled(KilnError):
    """The caller gave up on a sandboxed request (the HTTP client went away)."""

    kind = "cancelled"


#: Memory importing and planning a model takes, as a multiple of its file (its weights), at most: measured
#: 1.6 on ViT-B/16 in ONNX (330 MiB), 2.2 in .pt2, 2.1 on a 1 GiB MLP, 2.2 on a 160 MiB one (the data
#: segment's growth; issue 33's bound, which the refusal's message quotes).
PLANNING_MEMORY_RATIO = 3.0


def file_bytes(path: Any) -> int | None:
    """The size of the file at ``path`` (None when there is none)."""
    try:
        return Path(path).stat().st_size
    except (OSError, TypeError):
        return None


@dataclass(frozen=True)
class SandboxLimits:
    """What one sandboxed request may use."""

    memory_mb: int
    cpu_s: float
    timeout_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> SandboxLimits:
        return cls(
            memory_mb=settings.import_memory_mb,
            cpu_s=settings.import_cpu_s or settings.import_timeout_s,
            timeout_s=settings.import_timeout_s,
        )

    def too_much_memory(self, model_bytes: int | None = None) -> ModelTooLarge:
        """The refusal of a model that ran out of ``memory_mb``; for a model whose own size explains it
        (its weights times :data:`PLANNING_MEMORY_RATIO` exceed the limit), with the limit it needs."""
        message = f"model too large to import within {self.memory_mb} MiB of memory (KILN_IMPORT_MEMORY_MB)"
        if model_bytes and model_bytes * PLANNING_MEMORY_RATIO > self.memory_mb << 20:
            need = math.ceil(model_bytes * PLANNING_MEMORY_RATIO / (1 << 20) / 256) * 256
            message += (
                f": its {model_bytes / (1 << 20):.0f} MiB of weights need about {PLANNING_MEMORY_RATIO:g} "
                f"times that to import and plan; set KILN_IMPORT_MEMORY_MB to {need} or more"
            )
        return ModelTooLarge(message)

    def too_long(self, what: str, machine_busy: bool = False) -> ImportTimeout:
        return ImportTimeout(
            f"import took longer than {what} (KILN_IMPORT_TIMEOUT_S, KILN_IMPORT_CPU_S)", machine_busy
        )


class ModelSandbox:
    """Runs model requests in bounded child processes; thread-safe, one instance per service or command."""

    def __init__(self, settings: Settings, *, warm_processes: int | None = None) -> None:
        self.limits = SandboxLimits.from_settings(settings)
        self._slots = threading.BoundedSemaphore(settings.import_concurrency)
        warm = settings.import_warm_processes if warm_processes is None else warm_processes
        if warm:
            threading.Thread(target=_start_fork_server, name="kiln-importer-start", daemon=True).start()

    def run(self, op: str, args: dict[str, Any], cancelled: Callable[[], bool] | None = None) -> Any:
        """Run ``op`` (see :mod:`tuner.isolation.sandbox_child`) on ``args`` in a child; its result, or its typed error.

        Raises :class:`ModelTooLarge` or :class:`ImportTimeout` at a limit, :class:`Cancelled` when
        ``cancelled()`` turns true, :class:`InvalidModel` when the child crashes.
        """
        gave_up = cancelled or (lambda: False)
        while not self._slots.acquire(timeout=_POLL_S):
            if gave_up():
                raise Cancelled("the request was abandoned while waiting for an importer")
        try:
            child = _Child.start()
            try:
                child = self._send(child, op, args)
                return self._drive(child, gave_up, file_bytes(args.get("path")))
            finally:
                child.kill()
        finally:
            self._slots.release()

    def close(self) -> None:
        """Nothing to release: children end with their requests, the fork server with this process."""

    def __enter__(self) -> ModelSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- children ----------------------------------------------------------------------------------

    def _send(self, child: _Child, op: str, args: dict[str, Any]) -> _Child:
        """Give ``child`` the request; the child that has it (a fresh one if it died meanwhile)."""
        limits = {"memory_mb": self.limits.memory_mb, "cpu_s": self.limits.cpu_s}
        request = json.dumps({"op": op, "args": args, "limits": limits})
        try:
            child.send(request)
            return child
        except OSError:
            child.kill()
        child = _Child.start()
        try:
            child.send(request)
        except OSError:
            child.kill()
            raise ImporterCrashed("the importer process could not be started") from None
        return child

    def _drive(self, child: _Child, gave_up: Callable[[], bool], model_bytes: int | None) -> Any:
        limits = self.limits
        deadline = time.monotonic() + limits.timeout_s
        output = child.read_result(deadline, gave_up)
        if output is None:
            if gave_up():
                raise Cancelled("the request was abandoned; its importer was stopped")
            # Less than half the time on a CPU: the importer mostly waited for a busy machine.
            raise limits.too_long(f"{limits.timeout_s:g} s", machine_busy=child.cpu_s < limits.timeout_s / 2)
        status = child.wait()
        if not output:
            raise self._crash(child, status)
        reply = json.loads(output)
        if "ok" in reply:
            return reply["ok"]
        error = reply["error"]
        if error["kind"] == "memory":
            raise limits.too_much_memory(model_bytes)
        if error["kind"] == "cpu_time":
            raise limits.too_long(f"{limits.cpu_s:g} s of CPU time")
        raise rebuild_error(error["kind"], error["message"], error.get("details"))

    def _crash(self, child: _Child, status: int) -> KilnError:
        if status in (-signal.SIGXCPU, -signal.SIGKILL) and child.cpu_s >= self.limits.cpu_s - 2 * _POLL_S:
            return self.limits.too_long(f"{self.limits.cpu_s:g} s of CPU time")
        what = f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited with code {status}"
        log.warning("importer process %s; its stderr ends with:\n%s", what, child.stderr_tail())
        return ImporterCrashed(
            f"the importer process {what} while reading this model (within the limits of "
            f"{self.limits.memory_mb} MiB and {self.limits.timeout_s:g} s); the server is unaffected"
        )


class _Child:
    """One importer process, forked from the fork server with TVM loaded, given exactly one request."""

    def __init__(self, proc: ForkedProcess, stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.proc = proc
        self._stdin = stdin
        self._stdout = stdout
        self._stderr = stderr
        self.cpu_s = 0.0  # CPU time the request has used, as last seen (the limit counts from the request)
        self._cpu_at_request: float | None = None

    @classmethod
    def start(cls) -> _Child:
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - kept for the life of the child, closed by kill()
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            proc = _fork_server().spawn([stdin_r, stdout_w, stderr.fileno()])
        except ForkServerUnavailable as exc:
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            stderr.close()
            raise ImporterCrashed(f"the importer process could not be started ({exc})") from exc
        except BaseException:
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            stderr.close()
            raise
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        return cls(proc, os.fdopen(stdin_w, "wb"), os.fdopen(stdout_r, "rb"), stderr)

    def _cpu_total(self) -> float | None:
        try:
            times = psutil.Process(self.proc.pid).cpu_times()
        except psutil.Error:
            return None
        return float(times.user + times.system)

    def send(self, request: str) -> None:
        self._cpu_at_request = self._cpu_total()
        # stdin stays open: it is the child's lifeline (EOF ends it), closed by kill().
        self._stdin.write(request.encode() + b"\n")
        self._stdin.flush()

    def read_result(self, deadline: float, gave_up: Callable[[], bool]) -> bytes | None:
        """Everything the child writes to stdout until it closes it; None at the deadline or on give-up."""
        fd = self._stdout.fileno()
        chunks: list[bytes] = []
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or gave_up():
                    return None
                total = self._cpu_total()
                if total is not None and self._cpu_at_request is not None:
                    self.cpu_s = total - self._cpu_at_request
                if not selector.select(timeout=min(_POLL_S, remaining)):
                    continue
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)

    def wait(self) -> int:
        """Its exit code (negative: the signal that ended it); killed if it has not ended within 10 s."""
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode if self.proc.returncode is not None else -signal.SIGKILL

    def stderr_tail(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - _STDERR_TAIL))
            return self._stderr.read().decode(errors="replace")
        return ""

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for stream in (self._stdin, self._stdout):
            with contextlib.suppress(OSError):
                stream.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        with contextlib.suppress(OSError):
            self._stderr.close()


def _fork_server() -> ForkServer:
    """This process's fork server of importer children."""
    return shared_fork_server("tuner.isolation.sandbox_child", extra_env={WEIGHTS_ONLY_ENV: "1"})


def _start_fork_server() -> None:
    try:
        _fork_server().start()
    except ForkServerUnavailable as exc:  # the first request will try again and report it
        log.warning("%s", exc)


@contextlib.contextmanager
def memory_limit(memory_mb: int) -> Iterator[None]:
    """Bound what this process may allocate while the block runs (``RLIMIT_DATA``: now + ``memory_mb``).

    For model handling inside a process that must go on afterwards (a job's tuning process): allocations
    past the limit fail (``MemoryError``, ``std::bad_alloc``) instead of exhausting the machine.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    wanted = data_limit_bytes(memory_mb)
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def data_limit_bytes(memory_mb: int) -> int:
    """An ``RLIMIT_DATA`` that lets this process allocate ``memory_mb`` MiB more than it holds now."""
    return data_segment_bytes() + (memory_mb << 20)


def data_segment_bytes() -> int:
    """This process's data segment (``VmData``): what ``RLIMIT_DATA`` counts."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) << 10
    return 0


def is_out_of_memory(error: BaseException) -> bool:
    """Whether an exception is an allocation failure (Python's, numpy's or a C++ ``std::bad_alloc``)."""
    if isinstance(error, MemoryError):
        return True
    text = str(error)
    return "bad_alloc" in text or "Cannot allocate memory" in text or "Unable to allocate" in text


__all__ = ["Cancelled", "ModelSandbox", "SandboxLimits", "is_out_of_memory", "memory_limit"]
