"""A fork server: one interpreter that has loaded TVM once, forking a fresh process for every request.

Loading TVM and PyTorch takes 5-10 s of CPU per interpreter: a sandboxed import of a small model, or a
builder or runner worker of a tuning job, spent far more on that than on its work. The server process
(``python -m MODULE --fork-server FD``, whose ``main`` calls :func:`serve`) loads everything, then waits
on a Unix socket. For each request the parent sends the descriptors the new process gets as 0, 1, 2, ...
(stdin, stdout, stderr, then any others), a status pipe (``SCM_RIGHTS``) and the environment; the server
forks, the child takes them (and, for a server started with ``new_session``, a session of its own, so
that ``killpg`` reaches all it starts) and runs ``child_main``; the server replies with the child's pid
and, when it reaps it, writes its exit code (negative: the signal) to the status pipe.

The server itself runs nothing but the preload, so nothing passes from one request to the next, as with
fresh interpreters; it starts no threads before forking. It exits when its socket closes, i.e. when its
parent is gone. Standard library only (importing it loads no TVM): the TVM gate, the sandbox and the
workers use it.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
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

_READY = b"R"
_HEADER = struct.Struct("!I")  # the length of the request's JSON (its environment)
_PID = struct.Struct("!q")
#: The most descriptors one request may send (the child's, then the status pipe).
_MAX_FDS = 8
#: How long a running server may take to answer a request with the new process's pid (a fork takes
#: milliseconds): a server that does not answer is replaced, instead of holding every caller forever.
REPLY_TIMEOUT_S = 60.0


class ForkServerUnavailable(OSError):
    """The fork server could not be started, or died and could not be started again."""


class ForkedProcess:
    """A process forked by the server, with the part of ``subprocess.Popen``'s interface that Kiln and
    TVM's pools use: its pid (also its process group, in a new session), ``poll``, ``wait``, ``kill``."""

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

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; raises ``subprocess.TimeoutExpired`` if it runs past ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(f"process {self.pid}", timeout or 0.0)
            with selectors.DefaultSelector() as selector:
                selector.register(self._status_fd, selectors.EVENT_READ)
                selector.select(timeout=remaining)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL it (not its group)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def __del__(self) -> None:
        if self._status_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._status_fd)

    def _read_status(self) -> None:
        data = os.read(self._status_fd, 64)
        os.close(self._status_fd)
        self._status_fd = -1
        # An empty status: the server died before reaping it (its process group was killed with it).
        self.returncode = int(data) if data else -signal.SIGKILL


class ForkServer:
    """The parent's side: starts the server process, and asks it for new processes (thread-safe)."""

    def __init__(
        self,
        module: str,
        env: dict[str, str],
        start_timeout_s: float,
        *,
        new_session: bool = True,
        reply_timeout_s: float = REPLY_TIMEOUT_S,
    ) -> None:
        """``new_session``: the server (and the processes it forks) in a session of its own; else in
        this process's group, so that killing the group kills them too. ``reply_timeout_s``: how long
        a request may wait for the server's answer before the server is replaced."""
        self._module = module
        self._env = env
        self._start_timeout_s = start_timeout_s
        self._reply_timeout_s = reply_timeout_s
        self._new_session = new_session
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._stderr: IO[bytes] | None = None

    def spawn(self, fds: list[int], env: dict[str, str] | None = None) -> ForkedProcess:
        """A new process with ``fds`` as its descriptors 0, 1, 2, ... (the caller closes its copies) and
        ``env`` as its environment (default: the server's); starts the server first if it is not
        running. Raises :class:`ForkServerUnavailable` if it cannot be started."""
        payload = json.dumps({"env": env}).encode()
        with self._lock:
            for attempt in range(2):
                sock = self._running_socket()
                status_r, status_w = os.pipe()
                try:
                    socket.send_fds(sock, [_HEADER.pack(len(payload))], [*fds, status_w])
                    sock.sendall(payload)
                    reply = _recv_exactly(sock, _PID.size)
                except OSError:  # including no answer within the reply timeout
                    reply = b""
                finally:
                    os.close(status_w)
                if len(reply) == _PID.size and _PID.unpack(reply)[0] > 0:
                    return ForkedProcess(_PID.unpack(reply)[0], status_r)
                os.close(status_r)
                # It died between requests (killed, out of memory) or stopped answering: start another once.
                self._stop()
                if attempt:
                    raise ForkServerUnavailable(f"the {self._module} fork server stopped answering")
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
                start_new_session=self._new_session,
            )
        except OSError as exc:
            raise ForkServerUnavailable(
                f"the {self._module} fork server could not be started: {exc}"
            ) from exc
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
            raise ForkServerUnavailable(f"the {self._module} fork server could not be started: {tail[-400:]}")
        ours.settimeout(self._reply_timeout_s)
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


_shared_lock = threading.Lock()
_shared: dict[str, tuple[int, ForkServer]] = {}


def shared_fork_server(
    module: str,
    *,
    extra_env: dict[str, str] | None = None,
    start_timeout_s: float = 300.0,
    new_session: bool = True,
) -> ForkServer:
    """This process's fork server running ``module`` (made on first use; stopped at exit).

    The server is started, with this process's environment and ``extra_env``, by its first ``spawn``
    (or ``start``). A process forked from this one gets its own: the socket is its parent's conversation.
    """
    with _shared_lock:
        found = _shared.get(module)
        if found is None or found[0] != os.getpid():
            server = ForkServer(
                module, {**os.environ, **(extra_env or {})}, start_timeout_s, new_session=new_session
            )
            atexit.register(server.close)
            _shared[module] = found = (os.getpid(), server)
        return found[1]


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def serve(
    sock_fd: int, preload: Callable[[], None], child_main: Callable[[], None], *, new_session: bool = True
) -> None:
    """The server's side: ``preload()``, then fork a process running ``child_main()`` per request.

    ``child_main`` must end the process (``os._exit``); it runs with the request's descriptors as 0, 1, 2,
    ... and the request's environment. ``new_session``: each child in a session of its own.
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
                header, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
                payload = (
                    _recv_exactly(sock, _HEADER.unpack(header)[0]) if len(header) == _HEADER.size else b""
                )
            except OSError:
                header, fds = b"", []
            if not header:
                os._exit(0)  # the parent is gone
            if len(fds) < 2 or not payload:
                for fd in fds:
                    os.close(fd)
                sock.sendall(_PID.pack(-1))
                continue
            env = json.loads(payload)["env"]
            *child_fds, status_w = fds
            pid = os.fork()
            if pid == 0:
                # The child: drop the server's descriptors (their Python objects first, so that none
                # closes a reused number later), then take the request's.
                selector.close()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sock.close()
                for fd in (wake_r, wake_w, status_w, *status_fds.values()):
                    os.close(fd)
                if new_session:
                    os.setsid()
                _take_descriptors(child_fds)
                if env is not None:
                    os.environ.clear()
                    os.environ.update(env)
                child_main()
                os._exit(0)
            for fd in child_fds:
                os.close(fd)
            status_fds[pid] = status_w
            sock.sendall(_PID.pack(pid))
        _reap(status_fds)


def serve_main(
    module: str, preload: Callable[[], None], child_main: Callable[[], None], *, new_session: bool = True
) -> None:
    """:func:`serve` as ``python -m MODULE --fork-server FD`` (what :class:`ForkServer` starts)."""
    if sys.argv[1:2] != ["--fork-server"] or len(sys.argv) != 3:
        sys.exit(f"usage: python -m {module} --fork-server FD")
    serve(int(sys.argv[2]), preload, child_main, new_session=new_session)


def _take_descriptors(fds: list[int]) -> None:
    """Make ``fds`` this process's descriptors 0, 1, 2, ..."""
    # First above the range, so that no dup2 below overwrites one not yet moved.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, len(fds)) for fd in fds]
    for fd in fds:
        os.close(fd)
    for target, fd in enumerate(high):
        os.dup2(fd, target)
        os.close(fd)


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


__all__ = [
    "ForkServer",
    "ForkServerUnavailable",
    "ForkedProcess",
    "serve",
    "serve_main",
    "shared_fork_server",
]
