"""The model sandbox's children, forked from one process that loaded TVM: each request gets a fresh one,
a crash or a kill is reported as the importer's, and a fork server that dies is replaced."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import onnx
import psutil
import pytest

from tests.hostile_models import long_chain_onnx
from tests.model_builders import build_mlp
from tuner.errors import ImporterCrashed
from tuner.isolation.sandbox import ModelSandbox
from tuner.settings import Settings

pytestmark = pytest.mark.slow


@pytest.fixture
def sandbox(tmp_path: Path) -> ModelSandbox:
    return ModelSandbox(Settings(data_dir=tmp_path, database_url=None), warm_processes=0)


def _inspect_args(path: Path, blob_dir: Path) -> dict[str, Any]:
    return {
        "path": str(path),
        "input_shapes": None,
        "allow_external_data": False,
        "blob_dir": str(blob_dir),
        "max_unpacked_mb": 64,
    }


def _fork_servers() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "tuner.isolation.sandbox_child" in " ".join(
                child.cmdline()
            ):
                found.append(child)
        except psutil.Error:
            pass
    return found


def _importers() -> list[psutil.Process]:
    """The children of this process's fork server: requests in progress."""
    return [child for server in _fork_servers() for child in server.children()]


def test_each_request_runs_in_a_fresh_child_of_one_fork_server(sandbox: ModelSandbox, tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(), path)
    first = sandbox.run("inspect", _inspect_args(path, tmp_path / "blobs"))
    servers = _fork_servers()
    second = sandbox.run("inspect", _inspect_args(path, tmp_path / "blobs"))
    assert first["sha256"] == second["sha256"]
    assert Path(first["blob_tmp"]).exists() and first["blob_tmp"] != second["blob_tmp"]
    assert len(servers) == 1 and _fork_servers() == servers  # the same server forked both
    assert _importers() == []  # each child ended with its request


def _crash_during_a_long_request(sandbox: ModelSandbox, tmp_path: Path, signal_name: str) -> BaseException:
    path = tmp_path / "chain.onnx"
    onnx.save(long_chain_onnx(20_000), path)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            sandbox.run("inspect", _inspect_args(path, tmp_path / "blobs"))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120
    while not _importers() and time.monotonic() < deadline:
        time.sleep(0.05)
    (child,) = _importers()
    child.send_signal(getattr(signal, signal_name))
    thread.join(120)
    assert not thread.is_alive()
    (error,) = errors
    return error


def test_a_child_that_crashes_is_reported_and_the_next_request_works(
    sandbox: ModelSandbox, tmp_path: Path
) -> None:
    error = _crash_during_a_long_request(sandbox, tmp_path, "SIGSEGV")
    assert isinstance(error, ImporterCrashed)
    assert "was killed by SIGSEGV" in str(error) and "the server is unaffected" in str(error)
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(), path)
    assert sandbox.run("inspect", _inspect_args(path, tmp_path / "blobs"))["format"] == "onnx"


def test_a_fork_server_that_died_is_started_again(sandbox: ModelSandbox, tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(), path)
    sandbox.run("inspect", _inspect_args(path, tmp_path / "blobs"))
    (server,) = _fork_servers()
    server.kill()
    server.wait(10)
    assert sandbox.run("inspect", _inspect_args(path, tmp_path / "blobs"))["format"] == "onnx"
    (again,) = _fork_servers()
    assert again.pid != server.pid


def test_a_model_nested_past_the_recursion_limit_gets_a_typed_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's raw "maximum recursion depth exceeded while calling a Python object" is not a reason."""
    from tuner.isolation import sandbox_child

    def nests_forever(**_args: Any) -> Any:
        return nests_forever()

    monkeypatch.setitem(sandbox_child.OPS, "inspect", nests_forever)
    reply = sandbox_child._reply({"op": "inspect", "args": {}})
    assert reply == {
        "error": {
            "kind": "invalid_model",
            "message": "the model nests too deeply for Kiln's importers (their recursion limit): flatten its "
            "nested subgraphs or functions",
        }
    }
