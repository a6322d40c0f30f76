"""How the API answers `/healthz` while it is busy: 200 open event streams and 50 job submissions at once.

Starts a real `kiln serve` (SQLite, no embedded worker, so that submitted jobs stay queued) in its own
process, uploads a small MLP, then times `/healthz` every 50 ms: idle, with 200 event streams open, and
while 50 clients submit a job each at the same moment (repeated --rounds times). Prints p50/p95/max.

    .venv/bin/python -m bench.api_load [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import onnx

# The repository root, where tests/ lives, is not on the path when a bench script runs.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.model_builders import build_mlp  # noqa: E402

STREAMS = 200
SUBMISSIONS = 50


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(
        {"KILN_DATA_DIR": str(data_dir), "KILN_EMBEDDED_WORKERS": "0", "KILN_MAX_STREAMS_PER_USER": "1000"}
    )
    log = (data_dir.parent / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--port", str(port)], env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("the server did not start; see " + str(data_dir.parent / "server.log"))


def _summary(name: str, times_ms: list[float]) -> str:
    ordered = sorted(times_ms)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return (
        f"{name:<38} n={len(ordered):<4} p50 {statistics.median(ordered):7.1f} ms   "
        f"p95 {p95:7.1f} ms   max {ordered[-1]:7.1f} ms"
    )


async def _poll_healthz(http: httpx.AsyncClient, stop: asyncio.Event, out: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        response = await http.get("/healthz")
        out.append((time.perf_counter() - started) * 1e3)
        assert response.status_code == 200, response.text
        await asyncio.sleep(0.05)


async def _scenario(url: str, model_id: str, job_id: str, rounds: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"idle": [], "200 streams": [], "200 streams + 50 submissions": []}
    limits = httpx.Limits(max_connections=STREAMS + SUBMISSIONS + 20)
    async with (
        httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http,
        httpx.AsyncClient(base_url=url, timeout=30) as probe,
    ):
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll_healthz(probe, stop, results["idle"]))
        await asyncio.sleep(3)
        stop.set()
        await poller

        streams = [http.stream("GET", f"/api/v1/jobs/{job_id}/events") for _ in range(STREAMS)]
        opened = [await s.__aenter__() for s in streams]
        lines = [r.aiter_lines() for r in opened]
        await asyncio.gather(*(anext(it) for it in lines))
        try:
            stop = asyncio.Event()
            poller = asyncio.create_task(_poll_healthz(probe, stop, results["200 streams"]))
            await asyncio.sleep(3)
            stop.set()
            await poller

            body = {"model_id": model_id, "trials": 4}
            for _ in range(rounds):
                stop = asyncio.Event()
                timed = results["200 streams + 50 submissions"]
                poller = asyncio.create_task(_poll_healthz(probe, stop, timed))
                await asyncio.sleep(0.2)
                answers = await asyncio.gather(
                    *(http.post("/api/v1/jobs", json=body) for _ in range(SUBMISSIONS))
                )
                assert all(a.status_code == 202 for a in answers), {a.status_code for a in answers}
                stop.set()
                await poller
        finally:
            for s in streams:
                await s.__aexit__(None, None, None)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="bursts of 50 submissions")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _start(Path(tmp) / "data")
        try:
            buffer = io.BytesIO()
            onnx.save(build_mlp(), buffer)
            with httpx.Client(base_url=url, timeout=120) as client:
                model = client.post("/api/v1/models", files={"file": ("mlp.onnx", buffer.getvalue())}).json()
                job = client.post("/api/v1/jobs", json={"model_id": model["id"], "trials": 4}).json()
            results = asyncio.run(_scenario(url, model["id"], job["id"], args.rounds))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(
        f"# /healthz under load: kiln serve (SQLite) on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs"
    )
    for name, times in results.items():
        print(_summary(name, times))


if __name__ == "__main__":
    main()
