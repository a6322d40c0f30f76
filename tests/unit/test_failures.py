"""A failed job's reason: one sentence, no traceback, no path on the server; the traceback on the worker."""

from __future__ import annotations

import errno
import os
import textwrap
from pathlib import Path

import pytest

from forkserver import ForkServer, ForkServerUnavailable
from tuner.errors import InvalidModel
from tuner.jobs.failures import crash_report_path, describe_failure, without_paths, write_crash_report


def test_paths_are_cut_to_their_last_part_and_urls_are_kept() -> None:
    text = "cannot open /srv/kiln/data/jobs/1f2e/model.so at http://127.0.0.1:8000/api/v1 (see ./x/y and a/b)"
    assert without_paths(text) == "cannot open model.so at http://127.0.0.1:8000/api/v1 (see ./x/y and a/b)"
    assert without_paths("in /usr/lib/python3.11/site-packages/tvm/") == "in …"


def test_a_helper_that_cannot_import_a_module_names_the_module_and_how_to_install_it(
    tmp_path: Path,
) -> None:
    # A real fork server whose preload imports a module that is not installed (as tuner.timing.side_by_side's did
    # with onnxruntime on a base install).
    (tmp_path / "needs_a_missing_module.py").write_text(
        textwrap.dedent(
            """
            from forkserver import serve_main

            def _preload():
                import kiln_test_not_installed  # noqa: F401

            if __name__ == "__main__":
                serve_main("needs_a_missing_module", _preload, lambda: None)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[2]}"}
    server = ForkServer("needs_a_missing_module", env, start_timeout_s=60)
    with pytest.raises(ForkServerUnavailable) as raised:
        server.spawn([0, 1, 2])
    assert "File " in str(raised.value)  # what the exception carries: the tail of the helper's traceback
    reason = describe_failure(raised.value, "verifying")
    assert reason.startswith("kiln_test_not_installed is not installed on the worker")
    assert "while verifying" in reason and "pip install kiln_test_not_installed" in reason
    assert "Traceback" not in reason and "/" not in reason.replace("pip install", "")


def test_missing_onnxruntime_names_its_package() -> None:
    try:
        raise ModuleNotFoundError("No module named 'onnxruntime'", name="onnxruntime")
    except ModuleNotFoundError as exc:
        reason = describe_failure(exc, "measuring")
    assert reason.startswith("onnxruntime is not installed on the worker")
    assert "pip install onnxruntime" in reason


def test_an_unexpected_error_is_one_line_without_paths_and_its_traceback_goes_to_the_crash_report(
    tmp_path: Path,
) -> None:
    def fail() -> None:
        raise RuntimeError(
            'Traceback (most recent call last):\n  File "/srv/kiln/tvm/x.py", line 3\nboom in /srv/kiln/y.so'
        )

    try:
        fail()
    except RuntimeError as exc:
        reason = describe_failure(exc, "compiling")
        report = crash_report_path(tmp_path / "jobs", "job1")
        write_crash_report(report, exc, "compiling")
    assert reason == (
        "an internal error ended the job while compiling (RuntimeError: boom in y.so); "
        "the details are in crash.txt in the job's directory on the worker"
    )
    assert "\n" not in reason and "/srv" not in reason
    text = report.read_text()
    assert "the job failed while compiling" in text and "in fail" in text and "/srv/kiln/y.so" in text


def test_kiln_errors_keep_their_message_and_known_conditions_say_what_to_do() -> None:
    assert describe_failure(InvalidModel("model /data/blobs/ab/cd.onnx is truncated")) == (
        "model cd.onnx is truncated"
    )
    assert describe_failure(MemoryError(), "tuning").startswith("the worker ran out of memory while tuning")
    full = OSError(errno.ENOSPC, "No space left on device")
    assert describe_failure(full, "packing").startswith("the worker's disk is full while packing")


def test_a_long_message_is_cut() -> None:
    reason = describe_failure(ValueError("x" * 2000))
    assert len(reason) <= 300 and reason.endswith("…")


def test_a_fork_server_that_stops_answering_is_replaced_then_given_up(tmp_path: Path) -> None:
    # A server that starts, then never answers a request (as a wedged one would): the request waits no
    # longer than the reply timeout, the server is started again once, then the caller hears why.
    (tmp_path / "never_answers.py").write_text(
        textwrap.dedent(
            """
            import socket, sys

            if __name__ == "__main__":
                sock = socket.socket(fileno=int(sys.argv[2]))
                sock.sendall(b"R")
                while sock.recv(4096):  # reads requests, answers none; ends when the parent closes
                    pass
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[2]}"}
    server = ForkServer("never_answers", env, start_timeout_s=60, reply_timeout_s=0.5)
    try:
        with pytest.raises(ForkServerUnavailable, match="never_answers fork server stopped answering"):
            server.spawn([0, 1, 2])
    finally:
        server.close()
