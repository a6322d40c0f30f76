"""TVM's pool workers fork from Kiln's fork server: they run what TVM sends them, see this process's
environment as it is when they start, and a worker that dies is replaced like a Popen one."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from kiln_tvm import PopenPoolExecutor, StatusKind

pytestmark = pytest.mark.slow


def _parent_and_env() -> tuple[int, str | None]:
    return os.getppid(), os.environ.get("KILN_TEST_POPEN_MARK")


def _crash() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def _popen_fork_server() -> psutil.Process:
    (server,) = [p for p in psutil.Process().children() if "kiln_tvm.popen_workers" in " ".join(p.cmdline())]
    return server


def test_pool_workers_are_forked_and_see_the_current_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = PopenPoolExecutor(max_workers=1, timeout=60)
    try:
        pool.submit(_parent_and_env).result()  # starts the fork server if this process had none
        monkeypatch.setenv("KILN_TEST_POPEN_MARK", "set-later")
        fresh = PopenPoolExecutor(max_workers=1, timeout=60)
        try:
            parent, mark = fresh.submit(_parent_and_env).result()
        finally:
            fresh.shutdown()
        assert parent == _popen_fork_server().pid
        assert mark == "set-later"
    finally:
        pool.shutdown()


def test_a_worker_that_crashes_fails_its_call_and_the_next_call_gets_a_new_one() -> None:
    pool = PopenPoolExecutor(max_workers=1, timeout=60)
    try:
        (crashed,) = pool.map_with_error_catching(lambda _: _crash(), [0])
        assert crashed.status == StatusKind.EXCEPTION
        assert "ChildProcessError" in repr(crashed.value) or "terminated" in str(crashed.value)
        (again,) = pool.map_with_error_catching(lambda _: _parent_and_env(), [0])
        assert again.status == StatusKind.COMPLETE
        assert again.value[0] == _popen_fork_server().pid
    finally:
        pool.shutdown()
