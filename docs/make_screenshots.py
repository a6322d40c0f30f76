"""The README's screenshots of the dashboard, taken from a real `kiln serve` in Debian's Chromium.

    .venv/bin/python docs/make_screenshots.py [--trials 64]

Starts a server on a scratch data directory, tunes examples/small_cnn.onnx, makes one job fail (its model's
file removed from the data directory), and saves docs/job-page.png, docs/jobs-list.png,
docs/job-roofline.png, docs/job-lowering.png and docs/job-polyhedral.png at 1400 px. Needs the dev extras
(Playwright) and /usr/bin/chromium; run it on an otherwise idle machine, or the figures show that it was not.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _upload(http: httpx.Client, path: Path, name: str) -> dict:
    with path.open("rb") as fh:
        response = http.post("/api/v1/models", files={"file": (path.name, fh)}, data={"name": name})
    response.raise_for_status()
    return response.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-shots-") as tmp:
        data = Path(tmp) / "data"
        port = _free_port()
        env = {**os.environ, "KILN_DATA_DIR": str(data)}
        env.pop("KILN_DATABASE_URL", None)
        server = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "--port", str(port)], env=env, cwd=REPO
        )
        url = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                for _ in range(240):
                    try:
                        if http.get("/healthz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    time.sleep(0.5)
                cnn = _upload(http, REPO / "examples" / "small_cnn.onnx", "small_cnn")
                job = http.post("/api/v1/jobs", json={"model_id": cnn["id"], "trials": args.trials}).json()
                mlp = _upload(http, REPO / "examples" / "mlp.onnx", "mlp")
                next(data.rglob(f"{mlp['sha256']}*")).unlink()
                http.post("/api/v1/jobs", json={"model_id": mlp["id"], "trials": 8}).raise_for_status()
                while http.get(f"/api/v1/jobs/{job['id']}").json()["status"] in ("queued", "running"):
                    time.sleep(2)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS
                )
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{url}/#/jobs/{job['id']}")
                page.locator("#profile-table tbody tr").first.wait_for(timeout=120_000)
                page.locator("#lowering-diff").wait_for(timeout=60_000)
                page.wait_for_timeout(2500)  # the curves' last redraw
                page.screenshot(path=str(DOCS / "job-page.png"), full_page=True)
                page.locator("#profile").screenshot(path=str(DOCS / "job-roofline.png"))
                page.locator("#lowering").screenshot(path=str(DOCS / "job-lowering.png"))
                page.click(".tabs button[data-tab=polyhedral]")
                page.locator("#poly-legality tbody tr").first.wait_for(timeout=60_000)
                page.locator("#compiler-task").scroll_into_view_if_needed()
                page.screenshot(path=str(DOCS / "job-polyhedral.png"), full_page=True)
                page.goto(f"{url}/#/jobs")
                page.locator("#jobs-table .badge[data-status=failed]").wait_for(timeout=60_000)
                page.screenshot(path=str(DOCS / "jobs-list.png"))
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=60)
    print("screenshots written to", DOCS)


if __name__ == "__main__":
    main()
