"""Trials per minute of one job measuring through TVM's RPC tracker on 1, 2, ... servers of one key, tuned
by 1, 2, ... workers.

    .venv/bin/python bench/scale.py [--servers 1,2] [--workers 1] [--time 1m] [--model mlp]

For each server count and worker count, a fresh store, a tracker and that many Kiln RPC servers on this
machine, each pinned to a core of its own (server i to core i modulo the cores; the job's search and builds
run beside them), then one Kiln job on the model, measuring through the tracker with a time budget, run by W workers
(threads of this process, each running a job or a task group in a tuning process of its own, as `kiln
worker` does). With W > 1 the job is split (``JobSpec.workers``): the worker that claims it and the others
tune groups of its tasks at once, and the first compiles. It prints
the candidates measured, the tuning seconds, trials per minute and their ratio to the first row's per
server, and the job's estimated latency (Σ weight x best kernel latency). Issue 36's goal: trials per
minute scale by at least 0.85 x N with N servers. On a 2-core machine, N = 2 is the most this can say.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from _held_out_models import export_onnx
from _report import command_line, fmt, load_line, start_run, table, write_json
from _torch_models import MLP, SmallCNN

from cli.durations import format_duration, parse_duration
from tuner.entities import JobSpec, JobStatus, RunnerSpec
from tuner.jobs.submission import submit_job
from tuner.jobs.worker import Worker
from tuner.model_registry import register_model
from tuner.rpc.processes import start_server, start_tracker
from tuner.settings import Settings
from tuner.store import Store
from tuner.targets import resolve_target

MODELS = {"mlp": (MLP, (32, 256)), "small_cnn": (SmallCNN, (1, 3, 32, 32))}
KEY = "kiln-scale"


def tune_on_servers(onnx_path: Path, servers: int, workers: int, time_s: float, work: Path) -> dict[str, Any]:
    """One job on ``servers`` pinned RPC servers of one key, split over ``workers``: its trials, tuning
    time and estimate."""
    cores = sorted(os.sched_getaffinity(0))
    settings = Settings(
        data_dir=work / f"servers-{servers}-workers-{workers}",
        rpc_servers_per_job=servers,
        poll_interval_s=0.2,
    )
    store = Store.from_settings(settings)
    store.ensure_schema()
    with start_tracker("127.0.0.1", 0) as tracker:
        started = []
        try:
            for index in range(servers):
                server = start_server(tracker.address, KEY, "127.0.0.1", 0)
                started.append(server)
                if server.pid is not None:
                    os.sched_setaffinity(server.pid, {cores[index % len(cores)]})
            info, _ = register_model(store, settings, onnx_path, name=onnx_path.stem)
            spec = JobSpec(
                model_id=info.id,
                target=resolve_target("host"),
                trials=None,
                time_budget_s=time_s,
                runner=RunnerSpec("rpc", tracker.address, KEY),
                workers=workers,
            )
            job = submit_job(store, spec)
            start = time.perf_counter()
            with serving_workers(settings, store, workers):
                while not (done := store.get_job(job.id)).status.finished:
                    time.sleep(0.5)
            wall = time.perf_counter() - start
        finally:
            for server in started:
                server.terminate()
    if done.status is not JobStatus.SUCCEEDED:
        raise RuntimeError(f"the job on {servers} server(s) ended {done.status.value}: {done.error}")
    tasks = store.list_tasks(job.id)
    trials = sum(t.trials for t in tasks)
    tuning_s = done.tuning_s or wall
    estimate = sum(t.weight * (t.best_latency_us or 0.0) for t in tasks) / 1e3
    return {
        "servers": servers,
        "workers": workers,
        "groups": [(g.worker, list(g.task_indices), g.status.value) for g in store.task_groups(job.id)],
        "trials": trials,
        "tuning_s": tuning_s,
        "job_wall_s": wall,
        "estimate_ms": estimate,
    }


@contextlib.contextmanager
def serving_workers(settings: Settings, store: Store, count: int) -> Iterator[None]:
    """``count`` workers serving the store's queue (and split jobs' task groups) until the block ends: as
    `kiln worker` does, each runs a job or a group in a tuning process of its own."""
    pool = [Worker(settings, f"worker-{index}", store) for index in range(count)]
    threads = [threading.Thread(target=worker.run_forever, daemon=True) for worker in pool]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        for worker in pool:
            worker.stop()
        for thread in threads:
            thread.join(timeout=60)


def main() -> None:
    """Parse arguments, run one job per server count, print the table and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="1,2", help="comma-separated server counts")
    parser.add_argument("--workers", default="1", help="comma-separated worker counts (a split job)")
    parser.add_argument("--time", default="1m", help="each job's tuning budget")
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    args = parser.parse_args()
    counts = [(int(n), int(w)) for n in args.servers.split(",") for w in args.workers.split(",")]
    time_s = parse_duration(args.time)
    run_stamp, work, mach = start_run("scale")
    work.mkdir(parents=True, exist_ok=True)
    module_cls, shape = MODELS[args.model]
    torch.manual_seed(0)
    onnx_path = export_onnx(module_cls().eval(), torch.randn(shape), work / f"{args.model}.onnx")
    print(f"one job per server count, {format_duration(time_s)} of tuning each, model {args.model}")
    results = []
    for servers, workers in counts:
        results.append(tune_on_servers(onnx_path, servers, workers, time_s, work))
        print(f"  {servers} server(s), {workers} worker(s): {results[-1]['trials']} trials")
        write_json("scale", run_stamp, {"partial": True, "results": results, "machine": mach})
    base = results[0]["trials"] / results[0]["tuning_s"] * 60 / results[0]["servers"]
    rows = []
    for r in results:
        per_minute = r["trials"] / r["tuning_s"] * 60
        rows.append(
            [
                r["servers"],
                r["workers"],
                r["trials"],
                fmt(r["tuning_s"], ".0f"),
                fmt(per_minute, ".0f"),
                fmt(per_minute / base / r["servers"], ".2f"),
                fmt(r["estimate_ms"], ".3f"),
            ]
        )
    print()
    print(f"at the end: {load_line()}")
    print(
        table(
            [
                "servers",
                "workers",
                "trials",
                "tuning s",
                "trials / min",
                "÷ (servers × first row's)",
                "estimate ms",
            ],
            rows,
        )
    )
    payload = {
        "script": "scale",
        "command": command_line(),
        "stamp": run_stamp,
        "machine": mach,
        "results": results,
    }
    print(f"raw results: {write_json('scale', run_stamp, payload)}")


if __name__ == "__main__":
    main()
