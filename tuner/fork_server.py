"""A fork server: one interpreter that has loaded TVM once, forking a fresh process for every request.

Loading TVM, its importers and PyTorch takes 5-10 s of CPU per interpreter; a sandboxed request that
paid it every time spent far more on the import than on a typical model. The server process (started
with ``python -m tuner.sandbox_child --fork-server FD``) loads everything, then waits on a Unix socket.
For each request the parent sends the new process's stdin, stdout and stderr and a status pipe
(``SCM_RIGHTS``); the server forks, the child starts a session of its own (so ``killpg`` reaches all
it starts), takes the three descriptors as 0, 1 and 2 and runs the request; the server replies with the
child's pid and, when it reaps the child, writes its exit code (negative: the signal) to the status pipe.

The server itself never handles a model, so nothing passes from one request to the next, as with fresh
interpreters. It exits when its socket closes, i.e. when the parent is gone.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import IO

from tuner.errors import ImporterCrashed

_READY = b"R"
_SPAWN = b"S"
_PID = struct.Struct("!q")
#: Descriptors sent with each request: stdin, stdout, stderr, status pipe (write end).
_FDS_PER_REQUEST = 4


class ForkedProcess:
    """A process forked by the server: its pid (also its process group) and how it ended."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self._status_fd = status_fd
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Its exit code if it has ended (negative: killed by that signal), else None."""
        if self.returncode is None and self._status_fd >= 0:
            with selectors.DefaultSelector() as selector:
                selector.register(self._status_fd, selectors.EVENT_READ)
                if selector.select(timeout=0):
                    self._read_status()
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        """Its exit code, waiting up to ``timeout`` seconds; None if it is still running."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and self._status_fd >= 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            with selectors.DefaultSelector() as selector:
                selector.register(self._status_fd, selectors.EVENT_READ)
                selector.select(timeout=remaining)
        return self.returncode

    def _read_status(self) -> None:
        data = os.read(self._status_fd, 64)
        os.close(self._status_fd)
        self._status_fd = -1
        # An empty status: the server died before reaping it (its process group was killed with it).
        self.returncode = int(data) if data else -signal.SIGKILL

    def close(self) -> None:
        """Forget the process (it must have ended or been killed)."""
        if self._status_fd >= 0:
            os.close(self._status_fd)
            self._status_fd = -1


class ForkServer:
    """The parent's side: starts the server process, and asks it for new processes (thread-safe)."""

    def __init__(self, module: str, env: dict[str, str], start_timeout_s: float) -> None:
        self._module = module
        self._env = env
        self._start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._stderr: IO[bytes] | None = None

    def spawn(self, stdin: int, stdout: int, stderr: int) -> ForkedProcess:
        """A new process on these three descriptors (the caller closes its copies); starts the server
        first if it is not running. Raises :class:`ImporterCrashed` if the server cannot be started."""
        with self._lock:
            for attempt in range(2):
                sock = self._running_socket()
                status_r, status_w = os.pipe()
                try:
                    socket.send_fds(sock, [_SPAWN], [stdin, stdout, stderr, status_w])
                    reply = _recv_exactly(sock, _PID.size)
                except OSError:
                    reply = b""
                finally:
                    os.close(status_w)
                if len(reply) == _PID.size:
                    return ForkedProcess(_PID.unpack(reply)[0], status_r)
                os.close(status_r)
                self._stop()  # it died between requests (killed, out of memory): start another once
                if attempt:
                    raise ImporterCrashed("the importer process could not be started") from None
        raise AssertionError("unreachable")

    def start(self) -> None:
        """Start the server now (it is otherwise started by the first request)."""
        with self._lock:
            self._running_socket()

    def close(self) -> None:
        """Stop the server; processes it forked go on until their requests end."""
        with self._lock:
            self._stop()

    def _running_socket(self) -> socket.socket:
        if self._proc is not None and self._proc.poll() is None and self._sock is not None:
            return self._sock
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by _stop()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", self._module, "--fork-server", str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
                env=self._env,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        finally:
            theirs.close()
        self._sock = ours
        ours.settimeout(self._start_timeout_s)
        try:
            ready = _recv_exactly(ours, len(_READY))
        except OSError:
            ready = b""
        if ready != _READY:
            tail = self._stderr_tail()
            self._stop()
            raise ImporterCrashed(f"the importer process could not be started: {tail[-400:]}")
        ours.settimeout(None)
        return ours

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace").strip()
        return ""

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the server exits when its socket closes
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def serve(sock_fd: int, preload: Callable[[], None], child_main: Callable[[], None]) -> None:
    """The server's side: ``preload()``, then fork a process running ``child_main()`` per request.

    ``child_main`` must end the process (``os._exit``); it runs with the request's descriptors as 0-2.
    """
    preload()
    sock = socket.socket(fileno=sock_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    status_fds: dict[int, int] = {}
    sock.sendall(_READY)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                continue
            try:
                message, fds, _flags, _addr = socket.recv_fds(sock, 16, _FDS_PER_REQUEST)
            except OSError:
                message, fds = b"", []
            if not message:
                os._exit(0)  # the parent is gone
            if len(fds) != _FDS_PER_REQUEST:
                for fd in fds:
                    os.close(fd)
                sock.sendall(_PID.pack(-1))
                continue
            pid = os.fork()
            if pid == 0:
                # The child: drop the server's descriptors (their Python objects first, so that none
                # closes a reused number later), then take the request's.
                selector.close()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sock.close()
                for fd in (wake_r, wake_w, fds[3], *status_fds.values()):
                    os.close(fd)
                os.setsid()
                for target, fd in enumerate(fds[:3]):
                    os.dup2(fd, target)
                    os.close(fd)
                child_main()
                os._exit(0)
            for fd in fds[:3]:
                os.close(fd)
            status_fds[pid] = fds[3]
            sock.sendall(_PID.pack(pid))
        _reap(status_fds)


def _reap(status_fds: dict[int, int]) -> None:
    """Write each ended child's exit code to its status pipe."""
    while status_fds:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = status_fds.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, str(os.waitstatus_to_exitcode(status)).encode())
            os.close(fd)


__all__ = ["ForkServer", "ForkedProcess", "serve"]
