"""What resuming a job costs: a job run to its end by one worker, against the same job whose worker is
SIGKILLed once it has measured a round, then finished by a second worker.

    .venv/bin/python bench/resume.py [--model mlp|small_cnn] [--trials 40] [--kill-after 8]

Each job gets a fresh store and `kiln worker` processes as a deployment runs them (heartbeats every 0.5 s,
a worker lost after 3 s; rounds of 8 candidates). Printed, from the store as the workers write it:

* the uninterrupted job: seconds from its claim to its first measured record and to its end;
* the interrupted job: seconds from the kill to the second worker's claim (the lost worker noticed), from
  that claim to its first new record (a fresh tuning process: imports, the model's plan, the cost model
  catching up on the records the first worker stored), and to the job's end;
* the restart against the first start, and the interrupted job's total against the uninterrupted one's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _report import command_line, fmt, start_run, table, write_json

import tuner
from tuner.entities import JobSpec, JobStatus
from tuner.jobs.submission import submit_job
from tuner.model_registry import register_model
from tuner.settings import Settings
from tuner.store import Store

REPO = Path(__file__).resolve().parents[1]
#: The workers run the Kiln this script imports (PYTHONPATH=another checkout: that one's).
KILN = Path(tuner.__file__).resolve().parents[1]
MODELS = {"mlp": REPO / "examples" / "mlp.onnx", "small_cnn": REPO / "examples" / "small_cnn.onnx"}
WORKER_ENV = {
    "KILN_HEARTBEAT_S": "0.5",
    "KILN_STALE_AFTER_S": "3",
    "KILN_POLL_INTERVAL_S": "0.2",
    "KILN_NUM_TRIALS_PER_ITER": "8",
}
POLL_S = 0.1
TIMEOUT_S = 1800.0


def _settings(data_dir: Path) -> Settings:
    return Settings(data_dir=data_dir, database_url=None, heartbeat_s=0.5, stale_after_s=3.0)


def _queue(data_dir: Path, model: Path, trials: int) -> tuple[Store, str]:
    settings = _settings(data_dir)
    store = Store.from_settings(settings)
    store.ensure_schema()
    info, _ = register_model(store, settings, model)
    job = submit_job(store, JobSpec(model_id=info.id, target="host", trials=trials, seed=0))  # type: ignore[arg-type]
    return store, job.id


def _worker(data_dir: Path, name: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update({"KILN_DATA_DIR": str(data_dir), **WORKER_ENV})
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "worker", "--name", name],
        env=env,
        cwd=KILN,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait(what: str, condition: Any) -> float:
    """Poll ``condition`` until it holds; the monotonic time it was first seen to."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(POLL_S)
    raise SystemExit(f"timed out waiting for {what}")


def _claimed_by(store: Store, job_id: str, worker: str) -> bool:
    job = store.get_job(job_id)
    return job.status is JobStatus.RUNNING and job.worker == worker


def _ended(store: Store, job_id: str) -> bool:
    return store.get_job(job_id).status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


def _stop(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def uninterrupted(work: Path, model: Path, trials: int) -> dict[str, Any]:
    """One worker runs the job to its end."""
    store, job_id = _queue(work / "uninterrupted", model, trials)
    worker = _worker(work / "uninterrupted", "only")
    try:
        claimed = _wait("the claim", lambda: _claimed_by(store, job_id, "only"))
        first = _wait("a record", lambda: store.count_records(job_id=job_id) >= 1)
        ended = _wait("the end", lambda: _ended(store, job_id))
    finally:
        _stop(worker)
    job = store.get_job(job_id)
    return {
        "status": job.status.value,
        "records": store.count_records(job_id=job_id),
        "first_record_s": first - claimed,
        "total_s": ended - claimed,
    }


def interrupted(work: Path, model: Path, trials: int, kill_after: int) -> dict[str, Any]:
    """The first worker is SIGKILLed once the job has ``kill_after`` records; a second one finishes it."""
    store, job_id = _queue(work / "interrupted", model, trials)
    first_worker = _worker(work / "interrupted", "doomed")
    second_worker = None
    try:
        claimed = _wait("the claim", lambda: _claimed_by(store, job_id, "doomed"))
        _wait("a round", lambda: store.count_records(job_id=job_id) >= kill_after)
        first_worker.send_signal(signal.SIGKILL)  # its tuning processes die with it (PR_SET_PDEATHSIG)
        first_worker.wait()
        killed = time.monotonic()
        before = store.count_records(job_id=job_id)
        second_worker = _worker(work / "interrupted", "rescuer")
        reclaimed = _wait("the second claim", lambda: _claimed_by(store, job_id, "rescuer"))
        resumed = _wait("a new record", lambda: store.count_records(job_id=job_id) > before)
        ended = _wait("the end", lambda: _ended(store, job_id))
    finally:
        if first_worker.poll() is None:
            first_worker.kill()
        if second_worker is not None:
            _stop(second_worker)
    job = store.get_job(job_id)
    return {
        "status": job.status.value,
        "records": store.count_records(job_id=job_id),
        "records_at_kill": before,
        "requeue_s": reclaimed - killed,
        "first_new_record_s": resumed - reclaimed,
        "after_kill_s": ended - killed,
        "total_s": (killed - claimed) + (ended - killed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--kill-after", type=int, default=8, help="records measured before the kill")
    args = parser.parse_args()
    run_stamp, work, machine = start_run("resume")
    model = MODELS[args.model]
    whole = uninterrupted(work, model, args.trials)
    cut = interrupted(work, model, args.trials, args.kill_after)
    print(
        table(
            ["job", "status", "records", "claim → first record s", "kill → reclaim s", "total s"],
            [
                [
                    "uninterrupted",
                    whole["status"],
                    whole["records"],
                    fmt(whole["first_record_s"], ".1f"),
                    "",
                    fmt(whole["total_s"], ".1f"),
                ],
                [
                    "interrupted",
                    cut["status"],
                    f"{cut['records_at_kill']} + {cut['records'] - cut['records_at_kill']}",
                    fmt(cut["first_new_record_s"], ".1f"),
                    fmt(cut["requeue_s"], ".1f"),
                    fmt(cut["total_s"], ".1f"),
                ],
            ],
        )
    )
    print(
        f"restart (second claim → first new record) / first start: "
        f"{cut['first_new_record_s'] / whole['first_record_s']:.2f}"
    )
    print(f"interrupted total / uninterrupted total: {cut['total_s'] / whole['total_s']:.2f}")
    path = write_json(
        "resume",
        run_stamp,
        {
            "command": command_line(),
            "machine": machine,
            "model": args.model,
            "uninterrupted": whole,
            "interrupted": cut,
        },
    )
    print(f"raw results: {path}")


if __name__ == "__main__":
    main()
