"""Submit one job to a freshly started ``kiln serve`` and wait for it to succeed (standard library only: it
runs in a venv with nothing but Kiln's base install). Usage: base_install_job.py KILN MODEL.onnx"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> dict:
    req = urllib.request.Request(url, data=data, headers=headers or {})
    with urllib.request.urlopen(req, timeout=60) as response:
        return json.loads(response.read())


def upload(api: str, model: Path) -> dict:
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{model.name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + model.read_bytes()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return request(f"{api}/models", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})


def main() -> None:
    kiln, model = sys.argv[1], Path(sys.argv[2])
    port = free_port()
    server = subprocess.Popen([kiln, "serve", "--port", str(port)], env=os.environ)
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                request(f"http://127.0.0.1:{port}/healthz")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit("kiln serve did not come up")
                time.sleep(0.5)
        model_id = upload(api, model)["id"]
        job = request(
            f"{api}/jobs",
            json.dumps({"model_id": model_id, "trials": 8}).encode(),
            {"Content-Type": "application/json"},
        )
        deadline = time.monotonic() + 600
        while job["status"] in ("queued", "running"):
            if time.monotonic() > deadline:
                sys.exit(f"job {job['id']} did not finish within 10 minutes (stage {job['stage']})")
            time.sleep(2)
            job = request(f"{api}/jobs/{job['id']}")
        if job["status"] != "succeeded":
            sys.exit(f"job {job['id']} {job['status']}: {job['error']}")
        assert job["peer"] == "onnxruntime" and job["peer_speedup"] > 0, job
        print(
            f"job {job['id'][:8]} succeeded: tuned {job['tuned_latency_ms']:.3f} ms, "
            f"{job['peer_speedup']:.2f}x onnxruntime, {job['speedup']:.1f}x untuned TVM"
        )
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
