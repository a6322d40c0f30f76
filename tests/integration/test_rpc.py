"""Remote measurement through TVM's RPC tracker: a real tracker and server on loopback, a real tuning job."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest

from schedules.poly.caches import read_sysfs_caches
from service.schemas import TaskOut
from tests.artifacts import onnxruntime_output, run_artifact_in_fresh_process
from tests.gather_kernel import built_gather
from tests.host_jobs import run_host_job
from tests.model_builders import build_mlp
from tests.store_rows import TARGET, add_job, add_model, spec_for
from tuner.entities import FusionSummary, JobSpec, JobStatus, RunnerSpec, Task
from tuner.errors import DeviceUnavailable, InvalidSpec
from tuner.jobs.measuring import job_caches
from tuner.jobs.pipeline import run_job
from tuner.jobs.recorder import TuningClock
from tuner.jobs.submission import submit_job
from tuner.metaschedule.rpc_runner import make_rpc_runner
from tuner.model_registry import register_model
from tuner.rpc.device_info import device_caches
from tuner.rpc.processes import RPCProcess, start_server, start_tracker
from tuner.rpc.tracker import DeviceQueue, check_runner, tracker_summary
from tuner.settings import Settings
from tuner.store import Store
from tuner.targets import host_target

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KEY = "kiln-test"


@pytest.fixture(scope="module")
def tracker() -> Iterator[RPCProcess]:
    """A tracker on a free loopback port, for the whole module."""
    with start_tracker("127.0.0.1", 0) as process:
        yield process


@pytest.fixture(scope="module")
def server(tracker: RPCProcess) -> Iterator[RPCProcess]:
    """One RPC server registered at ``tracker`` under ``KEY``."""
    with start_server(tracker.address, KEY, "127.0.0.1", 0) as process:
        yield process


def _queue(address: str, key: str, free: int, wait_s: float = 10.0) -> DeviceQueue | None:
    """The queue of ``key`` once it shows ``free`` idle servers (a finished session takes a moment)."""
    deadline = time.monotonic() + wait_s
    while True:
        queue = next((q for q in tracker_summary(address, 5.0) if q.key == key), None)
        if (queue is not None and queue.free == free) or time.monotonic() > deadline:
            return queue
        time.sleep(0.2)


def _gone(address: str, key: str, wait_s: float = 10.0) -> bool:
    """Whether the tracker dropped every server of ``key`` (it notices a closed connection at once)."""
    deadline = time.monotonic() + wait_s
    while any(q.key == key for q in tracker_summary(address, 5.0)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_tracker_summary_lists_the_server(tracker: RPCProcess, server: RPCProcess) -> None:
    assert _queue(tracker.address, KEY, free=1) == DeviceQueue(key=KEY, free=1, pending=0, total=1)


def test_check_runner_accepts_a_registered_key_and_the_local_runner(
    tracker: RPCProcess, server: RPCProcess
) -> None:
    _queue(tracker.address, KEY, free=1)  # an earlier test's session may still be closing
    queue = check_runner(RunnerSpec("rpc", tracker.address, KEY), timeout_s=5.0)
    assert queue is not None and (queue.key, queue.total) == (KEY, 1)
    assert check_runner(RunnerSpec(), timeout_s=5.0) is None  # the local runner asks no tracker


def test_check_runner_raises_for_an_unreachable_tracker() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(DeviceUnavailable, match="cannot reach the RPC tracker") as info:
        check_runner(RunnerSpec("rpc", address, KEY), timeout_s=5.0)
    assert info.value.kind == "device_unavailable"


def test_check_runner_raises_for_a_port_that_never_answers() -> None:
    # Accepts connections (the kernel's backlog) but never speaks the tracker protocol.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(DeviceUnavailable, match="did not answer as a TVM RPC tracker"):
            check_runner(RunnerSpec("rpc", address, KEY), timeout_s=1.0)


def test_check_runner_raises_for_an_rpc_server_port(server: RPCProcess) -> None:
    with pytest.raises(DeviceUnavailable, match="not a TVM RPC tracker"):
        check_runner(RunnerSpec("rpc", server.address, KEY), timeout_s=5.0)


def test_check_runner_raises_for_an_unknown_key(tracker: RPCProcess, server: RPCProcess) -> None:
    runner = RunnerSpec("rpc", tracker.address, "no-such-device")
    with pytest.raises(DeviceUnavailable, match="no RPC server with key 'no-such-device'") as info:
        check_runner(runner, timeout_s=5.0)
    assert f"kiln rpc server --tracker {tracker.address} --key no-such-device" in info.value.message
    assert f"'{KEY}'" in info.value.message  # lists what is registered


@pytest.mark.parametrize(
    "runner",
    [
        {"kind": "rpc", "tracker": "localhost", "key": KEY},
        {"kind": "rpc", "tracker": "localhost:99999", "key": KEY},
        {"kind": "rpc", "tracker": "localhost:9190"},
        {"kind": "gpu"},
    ],
)
def test_check_runner_rejects_malformed_runners(runner: dict) -> None:
    with pytest.raises(InvalidSpec):
        check_runner(RunnerSpec.from_dict(runner), timeout_s=1.0)


def test_guarded_runner_fails_fast_once_the_device_is_gone(tracker: RPCProcess) -> None:
    from kiln_tvm import ms

    with start_server(tracker.address, "kiln-gone", "127.0.0.1", 0):
        runner = make_rpc_runner(
            RunnerSpec("rpc", tracker.address, "kiln-gone", timeout_s=5),
            ms.runner.EvaluatorConfig(number=1, repeat=1),
        )
    assert _gone(tracker.address, "kiln-gone")
    # The server is gone: the next batch fails at once instead of waiting at the tracker.
    with pytest.raises(DeviceUnavailable, match="no RPC server with key 'kiln-gone'"):
        runner.run([])


def test_a_candidate_waiting_for_a_busy_server_times_out(tracker: RPCProcess, server: RPCProcess) -> None:
    from kiln_tvm import ms

    host, port = tracker.address.rsplit(":", 1)
    config = ms.runner.RPCConfig(
        tracker_host=host, tracker_port=int(port), tracker_key=KEY, session_timeout_sec=300
    )
    busy = config.connect_server()  # another client holds the only server
    try:
        assert _queue(tracker.address, KEY, free=0) == DeviceQueue(key=KEY, free=0, pending=0, total=1)
        runner = make_rpc_runner(
            RunnerSpec("rpc", tracker.address, KEY, session_timeout_s=1, queue_timeout_s=2),
            ms.runner.EvaluatorConfig(number=1, repeat=1),
        )
        candidate = ms.runner.RunnerInput(
            "/nonexistent/tvm_tmp_mod.tar", "cpu", [ms.arg_info.TensorInfo("float32", [4])]
        )
        started = time.monotonic()
        (future,) = runner.run([candidate])
        result = future.result()
        # TVM's stock RPCRunner would wait at the tracker for as long as the server stays busy.
        assert "Timeout" in str(result.error_msg)
        assert time.monotonic() - started < 60
    finally:
        del busy  # closes the session
    assert _queue(tracker.address, KEY, free=1) == DeviceQueue(key=KEY, free=1, pending=0, total=1)


def test_a_gather_is_measured_through_the_rpc_runner(tracker: RPCProcess, server: RPCProcess) -> None:
    from kiln_tvm import ms

    path, args = built_gather()
    runner = make_rpc_runner(
        RunnerSpec("rpc", tracker.address, KEY),
        ms.runner.EvaluatorConfig(number=1, repeat=2, min_repeat_ms=1),
    )
    (future,) = runner.run([ms.runner.RunnerInput(path, "cpu", args)])
    result = future.result()
    # Random integer bits would index far outside the table: the server's process would crash.
    assert result.error_msg is None, result.error_msg
    assert len(result.run_secs) == 2


def test_a_batch_fans_out_over_every_free_server_of_the_key(tracker: RPCProcess) -> None:
    """Two servers under one key: a batch measures on both at once, one candidate per server, and hands
    them back to the tracker when it is done."""
    from kiln_tvm import ms

    path, args = built_gather()
    with (
        start_server(tracker.address, "kiln-pair", "127.0.0.1", 0) as first,
        start_server(tracker.address, "kiln-pair", "127.0.0.1", 0) as second,
    ):
        runner = make_rpc_runner(
            RunnerSpec("rpc", tracker.address, "kiln-pair"),
            ms.runner.EvaluatorConfig(number=1, repeat=2, min_repeat_ms=150),  # >= 0.3 s a candidate
            servers=8,
        )
        # The tracker, asked while the batch runs, sees both servers busy at once.
        idle: list[int] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                idle.extend(q.free for q in tracker_summary(tracker.address, 5.0) if q.key == "kiln-pair")
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            results = [f.result() for f in runner.run([ms.runner.RunnerInput(path, "cpu", args)] * 6)]
        finally:
            done.set()
            watcher.join()
        assert [r.error_msg for r in results] == [None] * 6
        assert all(len(r.run_secs) == 2 for r in results)
        assert 0 in idle, idle
        # Three waves of two: each server measured three candidates.
        assert runner.served == {first.address: 3, second.address: 3}
        queue = _queue(tracker.address, "kiln-pair", free=2)
        assert queue == DeviceQueue(key="kiln-pair", free=2, pending=0, total=2)


def test_two_jobs_on_one_farm_take_turns_on_its_servers(tracker: RPCProcess) -> None:
    """Two runners (two jobs) measuring on the same two servers at once: servers go back to the tracker
    between waves and its queue serves requests in turn, so both progress together; neither waits for the
    other's whole batch."""
    from kiln_tvm import ms

    path, args = built_gather()
    with (
        start_server(tracker.address, "kiln-farm", "127.0.0.1", 0) as first,
        start_server(tracker.address, "kiln-farm", "127.0.0.1", 0) as second,
    ):
        runners = [
            make_rpc_runner(
                RunnerSpec("rpc", tracker.address, "kiln-farm"),
                ms.runner.EvaluatorConfig(number=1, repeat=2, min_repeat_ms=150),  # >= 0.3 s a candidate
                servers=8,
            )
            for _ in range(2)
        ]
        candidates = [ms.runner.RunnerInput(path, "cpu", args)] * 6
        results: list[list] = [[], []]
        progress: list[tuple[int, int]] = []

        def measure(which: int) -> None:
            results[which] = [f.result() for f in runners[which].run(candidates)]

        jobs = [threading.Thread(target=measure, args=(i,)) for i in range(2)]
        for job in jobs:
            job.start()
        while any(job.is_alive() for job in jobs):
            progress.append(tuple(sum(r.served.values()) for r in runners))  # type: ignore[arg-type]
            time.sleep(0.02)
        for job in jobs:
            job.join()
    for measured in results:
        assert [r.error_msg for r in measured] == [None] * 6
    assert [sum(r.served.values()) for r in runners] == [6, 6]
    # Each job measured on both servers, and at some moment both had measured some but not all.
    assert all(set(r.served) == {first.address, second.address} for r in runners), [r.served for r in runners]
    assert any(0 < a < 6 and 0 < b < 6 for a, b in progress), progress


def test_a_server_killed_mid_batch_loses_no_candidate(tracker: RPCProcess) -> None:
    """One of two servers dies while it measures: its candidate is measured again on the other, and the
    batch finishes with every candidate measured."""
    from kiln_tvm import ms

    path, args = built_gather()
    with (
        start_server(tracker.address, "kiln-dying", "127.0.0.1", 0) as survivor,
        start_server(tracker.address, "kiln-dying", "127.0.0.1", 0) as dying,
    ):
        runner = make_rpc_runner(
            RunnerSpec("rpc", tracker.address, "kiln-dying", session_timeout_s=30, queue_timeout_s=30),
            ms.runner.EvaluatorConfig(number=1, repeat=3, min_repeat_ms=400),  # >= 1.2 s a candidate
            servers=2,
        )
        killer = threading.Timer(0.8, dying.terminate)
        killer.start()
        try:
            results = [f.result() for f in runner.run([ms.runner.RunnerInput(path, "cpu", args)] * 4)]
        finally:
            killer.join()
        assert [r.error_msg for r in results] == [None] * 4
        assert runner.served[survivor.address] >= 3 and sum(runner.served.values()) == 4


def test_mlp_tunes_through_the_rpc_runner(
    tracker: RPCProcess, server: RPCProcess, store: Store, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(seed=5), str(path))
    runner = RunnerSpec("rpc", tracker.address, KEY)
    result = run_host_job(store, settings, path, trials=8, runner=runner)

    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    records = store.list_records(job_id=result.job.id)
    assert 0 < len(records) <= 8
    assert store.count_records(job_id=result.job.id) == len(records) == sum(t.trials for t in result.tasks)
    # Every candidate was uploaded to the server, linked and run there: none failed.
    assert all(r.error is None for r in records), [r.error for r in records]
    assert all(r.mean_latency_us is not None and 0 < r.mean_latency_us < 1e6 for r in records)
    assert all(r.run_secs and all(0 < s < 1 for s in r.run_secs) for r in records)
    assert all(c.ok for c in result.comparisons)
    # The artifact built from the records measured remotely computes what onnxruntime computes.
    x = np.random.default_rng(3).standard_normal((1, 256)).astype(np.float32)
    got = run_artifact_in_fresh_process(Path(result.artifact.path), x, tmp_path)
    np.testing.assert_allclose(got, onnxruntime_output(path, x), rtol=1e-4, atol=1e-5)
    # Each task says which server measured its candidates.
    measured_on = Counter[str]()
    for task in store.list_tasks(result.job.id):
        measured_on.update((task.search_stats or {}).get("measured_on", {}))
    assert measured_on == {server.address: len(records)}
    # The server is free again for the next job.
    assert _queue(tracker.address, KEY, free=1) == DeviceQueue(key=KEY, free=1, pending=0, total=1)


def test_a_job_on_two_servers_of_its_key_measures_on_both(
    tracker: RPCProcess, store: Store, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(seed=6), str(path))
    with (
        start_server(tracker.address, "kiln-job-pair", "127.0.0.1", 0) as first,
        start_server(tracker.address, "kiln-job-pair", "127.0.0.1", 0) as second,
    ):
        runner = RunnerSpec("rpc", tracker.address, "kiln-job-pair")
        result = run_host_job(store, settings, path, trials=12, runner=runner)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    records = store.list_records(job_id=result.job.id)
    assert records and all(r.error is None for r in records), [r.error for r in records]
    measured_on = Counter[str]()
    # As GET /api/v1/jobs/{id}/tasks serves them.
    for task in TaskOut.list_of(store.list_tasks(result.job.id)):
        measured_on.update((task.search_stats or {}).get("measured_on", {}))  # type: ignore[arg-type]
    assert set(measured_on) == {first.address, second.address}, measured_on
    assert sum(measured_on.values()) == len(records)
    # Noted batch by batch while the job ran (what the devices page shows of a running job).
    uses = store.server_uses(job_id=result.job.id)
    assert {u.server: u.candidates for u in uses} == dict(measured_on)
    assert {u.key for u in uses} == {"kiln-job-pair"}


class _KillMidBatch:
    """A job listener that, once the job has measured its first batch, kills an RPC server while it is
    measuring a candidate."""

    def __init__(self, server: RPCProcess) -> None:
        self.server = server
        self.killed_after_batches: int | None = None
        self.batches = 0
        self._watcher: threading.Thread | None = None

    def stage(self, name: str) -> None:
        pass

    def planned(self, tasks: list[Task], fusion: FusionSummary, trials_total: int) -> None:
        pass

    def tuning(self, clock: TuningClock) -> None:
        pass

    def measured(self, task: Task, trials_done: int, trials_total: int) -> None:
        self.batches += 1
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._kill_when_busy, daemon=True)
            self._watcher.start()

    def _kill_when_busy(self) -> None:
        # A TVM server forks a process per session: while it has one, it is measuring a candidate.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.server.pid is not None:
            if psutil.Process(self.server.pid).children():
                self.server.terminate()
                self.killed_after_batches = self.batches
                return
            time.sleep(0.005)


def test_a_job_whose_server_is_killed_mid_batch_finishes_on_the_other(
    tracker: RPCProcess, store: Store, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(seed=7), str(path))
    # Batches of 4 candidates, each measured for >= 0.6 s: two waves of two a batch, both servers busy.
    slow = settings.model_copy(update={"num_trials_per_iter": 4, "measure_min_repeat_ms": 200})
    with (
        start_server(tracker.address, "kiln-job-dying", "127.0.0.1", 0) as survivor,
        start_server(tracker.address, "kiln-job-dying", "127.0.0.1", 0) as dying,
    ):
        killer = _KillMidBatch(dying)
        runner = RunnerSpec("rpc", tracker.address, "kiln-job-dying")
        result = run_host_job(store, slow, path, listener=killer, trials=12, runner=runner)
    # Killed while the job still had batches to measure.
    assert killer.killed_after_batches is not None and killer.killed_after_batches < killer.batches
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    records = store.list_records(job_id=result.job.id)
    # The candidate the dead server was measuring was measured again on the survivor: every candidate the
    # job tried has a valid record.
    assert len(records) > 4 and all(r.error is None for r in records), [r.error for r in records]
    assert len(records) == sum(t.trials for t in result.tasks)
    uses = {u.server: u.candidates for u in store.server_uses(job_id=result.job.id)}
    assert sum(uses.values()) == len(records)
    assert uses[survivor.address] > uses.get(dying.address, 0)


def test_kilns_server_reports_its_caches_for_cpu_poly(
    tracker: RPCProcess, server: RPCProcess, settings: Settings
) -> None:
    runner = RunnerSpec("rpc", tracker.address, KEY)
    reported = device_caches(runner, 10.0)
    local = read_sysfs_caches()
    if not local.known:
        pytest.skip("this machine's sysfs does not list its caches, so the server has none to report")
    assert reported is not None and reported.source == "rpc device"
    assert reported.levels == local.levels
    _queue(tracker.address, KEY, free=1)  # the session just closed: the server is free again in a moment
    # A cpu-poly job on that device holds its tiles against what the device said; a cpu job asks nothing.
    poly = JobSpec(model_id="m", target=host_target(), trials=1, runner=runner, space="cpu-poly")
    assert job_caches(settings, poly).source == "rpc device"
    plain = JobSpec(model_id="m", target=host_target(), trials=1, runner=runner, space="cpu")
    assert job_caches(settings, plain).source == "unknown"
    assert _queue(tracker.address, KEY, free=1) == DeviceQueue(key=KEY, free=1, pending=0, total=1)


def test_without_a_free_server_the_device_does_not_say(tracker: RPCProcess) -> None:
    assert device_caches(RunnerSpec("rpc", tracker.address, "nobody-has-this-key"), 1.0) is None


def _kiln(*args: str, tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "cli", "--data-dir", str(tmp_path), *args]


def _env() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("KILN_DATABASE_URL", None)
    env.pop("KILN_RPC_TRACKER", None)
    return env


def test_cli_devices_prints_the_registered_keys(
    tracker: RPCProcess, server: RPCProcess, tmp_path: Path
) -> None:
    done = subprocess.run(
        _kiln("rpc", "devices", "--tracker", tracker.address, tmp_path=tmp_path),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert f"RPC devices at {tracker.address}" in done.stdout
    # key, servers, free, pending
    assert re.search(rf"{KEY}\s*│\s*1\s*│\s*1\s*│\s*0\s*│", done.stdout), done.stdout

    down = subprocess.run(
        _kiln("rpc", "devices", "--tracker", f"127.0.0.1:{_closed_port()}", tmp_path=tmp_path),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
        cwd=REPO,
    )
    assert down.returncode == 2
    assert "device_unavailable" in down.stderr and "Traceback" not in down.stderr


def _cli_server(tracker: str, key: str, tmp_path: Path) -> subprocess.Popen[str]:
    """`kiln rpc server` registering at ``tracker`` under ``key``, on a free port."""
    return subprocess.Popen(
        _kiln("rpc", "server", "--tracker", tracker, "--key", key, "--port", "0", tmp_path=tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=REPO,
    )


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM, then what it printed."""
    proc.send_signal(signal.SIGTERM)
    return proc.communicate(timeout=30)


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_cli_server_registers_and_stops_on_sigterm(tracker: RPCProcess, tmp_path: Path) -> None:
    key = "kiln-cli"
    proc = _cli_server(tracker.address, key, tmp_path)
    try:
        assert _queue(tracker.address, key, free=1, wait_s=60.0) is not None, "server never registered"
        out, err = _stop(proc)
    finally:
        _kill(proc)
    assert proc.returncode == 0, err
    assert f"RPC server {key} listening on 127.0.0.1:" in out and "RPC server stopped" in out
    # Its child processes went with it: the tracker dropped the registration.
    assert _gone(tracker.address, key)


def test_cli_server_started_before_its_tracker_waits_for_it(tmp_path: Path) -> None:
    """As in docker-compose, a device server may start before its tracker: it keeps trying, then
    registers; one given no time gives up at once with the reason."""
    port = _closed_port()
    key = "kiln-early"
    proc = _cli_server(f"127.0.0.1:{port}", key, tmp_path)
    try:
        # The tracker starts once the server has found it missing (its start, loading TVM, can take longer
        # than a fixed sleep on a busy machine) and then stayed up longer than the old server took to give up.
        assert proc.stderr is not None
        waited = ""
        while "trying again for up to 60 s" not in waited:
            line = proc.stderr.readline()
            assert line, (waited, proc.communicate())  # it ended without saying it would wait
            waited += line
        time.sleep(4.0)
        assert proc.poll() is None, proc.communicate()
        with start_tracker("127.0.0.1", port) as late:
            assert _queue(late.address, key, free=1, wait_s=60.0) is not None, "server never registered"
            out, err = _stop(proc)
    finally:
        _kill(proc)
    assert proc.returncode == 0, waited + err
    assert f"registered at tracker 127.0.0.1:{port}" in out

    impatient = subprocess.run(
        _kiln(
            "rpc",
            "server",
            "--tracker",
            f"127.0.0.1:{_closed_port()}",
            "--key",
            key,
            "--tracker-wait",
            "0",
            tmp_path=tmp_path,
        ),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
        cwd=REPO,
    )
    assert impatient.returncode == 2 and "device_unavailable" in impatient.stderr


def test_devices_route_shows_the_trackers_queue(
    tracker: RPCProcess, server: RPCProcess, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app

    settings = Settings(
        data_dir=tmp_path / "api", database_url=None, embedded_workers=0, rpc_tracker=tracker.address
    )
    with TestClient(create_app(settings)) as client:
        body = client.get("/api/v1/devices").json()
    assert body["tracker"] == tracker.address
    assert {"key": KEY, "free": 1, "pending": 0, "total": 1, "in_use": []} in body["devices"]

    # Running jobs measuring on the key's servers show by server, the latest first; another user's job
    # shows without its id; a finished job's servers are not in use.
    store = Store.from_settings(settings)
    mine, done = add_job(store, "a" * 64), add_job(store, "b" * 64)
    theirs = store.create_job(spec_for(add_model(store, "c" * 64, owner="alice").id), TARGET, "alice").id
    for job in (mine, theirs, done):
        store.mark_job_running(job, "w1")
    store.note_server_use(mine, KEY, {"10.0.0.1:9090": 2})
    store.note_server_use(theirs, KEY, {"10.0.0.2:9090": 1})
    store.note_server_use(done, KEY, {"10.0.0.1:9090": 5})
    store.note_server_use(mine, "another-key", {"10.0.0.3:9090": 1})  # not registered at this tracker
    store.finish_job(done, JobStatus.SUCCEEDED)
    with TestClient(create_app(settings)) as client:
        (device,) = [d for d in client.get("/api/v1/devices").json()["devices"] if d["key"] == KEY]
    assert [(u["server"], u["job_id"], u["candidates"]) for u in device["in_use"]] == [
        ("10.0.0.2:9090", None, 1),
        ("10.0.0.1:9090", mine, 2),
    ]

    dead = settings.model_copy(update={"rpc_tracker": f"127.0.0.1:{_closed_port()}"})
    with TestClient(create_app(dead)) as client:
        response = client.get("/api/v1/devices")
    assert response.status_code == 503
    assert response.json()["error"]["kind"] == "device_unavailable"


def test_a_job_whose_tracker_is_unreachable_fails_with_a_clear_error(
    store: Store, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(seed=6), str(path))
    model, _ = register_model(store, settings, path)
    runner = RunnerSpec("rpc", f"127.0.0.1:{_closed_port()}", KEY)
    job = submit_job(store, JobSpec(model_id=model.id, target=host_target(), trials=8, runner=runner))
    with pytest.raises(DeviceUnavailable):
        run_job(store, settings, job.id)
    failed = store.get_job(job.id)
    assert failed.status is JobStatus.FAILED
    assert "unreachable" in failed.error or "refused" in failed.error, failed.error
    assert store.count_records(job_id=job.id) == 0
