"""The dashboard in a real browser: Playwright driving Debian's Chromium against `kiln serve`.

Browsers cannot be downloaded here, so the test uses /usr/bin/chromium (`.ci/run` installs it). Without
it the test skips, except where KILN_REQUIRE_BROWSER=1 (CI), where it fails.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import onnx
import pytest

from tests.model_builders import PARAMETER_VALUES, build_mlp, parameterized_onnx
from tests.store_rows import TARGET, add_job, add_model, spec_for
from tuner.rpc.processes import start_server as start_server_process
from tuner.rpc.processes import start_tracker
from tuner.settings import Settings
from tuner.store import Store

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
OUTPUT = Path(__file__).resolve().parents[1] / "output"
# Quiet, offline-friendly Chromium: no background connections this machine's network would refuse.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def browser_page() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("KILN_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{CHROMIUM} is missing (apt-get install chromium)")
        pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        page = context.new_page()
        page.set_default_timeout(30_000)
        try:
            yield page
        finally:
            context.close()
            browser.close()


def test_upload_tune_watch_inspect_download(
    start_server: Callable[..., str], browser_page, tmp_path: Path
) -> None:
    page = browser_page
    url = start_server()
    model_path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(seed=21), str(model_path))
    garbage = tmp_path / "broken.onnx"
    garbage.write_bytes(b"\x08\x07 not a model" * 8)

    page.goto(url + "/")
    page.get_by_text("No job yet").wait_for()
    page.click("text=New job")

    # An import error from the server is shown next to the form.
    page.set_input_files("#model-file", str(garbage))
    page.click("#upload-form button[type=submit]")
    error = page.locator("#upload-form .error")
    error.wait_for()
    assert "invalid_model" in error.inner_text() and "broken.onnx" in error.inner_text()

    page.set_input_files("#model-file", str(model_path))
    page.click("#upload-form button[type=submit]")
    page.locator("#model-ready").wait_for()
    assert "x" in page.locator("#model-ready + table").inner_text()
    page.locator("#task-preview table tbody tr").first.wait_for(timeout=120_000)
    assert page.locator("#task-preview table tbody tr").count() == 2

    page.fill("#trials", "8")
    page.fill("#time-budget", "10")  # minutes; the 8 trials end first
    page.select_option("#space", "cpu-poly")
    # The form proposes the auto precision (int8 with calibration inputs, bf16 where the CPU multiplies it
    # natively, else the model's own). This job keeps the model's.
    assert page.locator("#precision").input_value() == "auto"
    page.select_option("#precision", "as-is")
    page.click("#start-job")
    page.wait_for_url("**/#/jobs/*")
    job_id = page.url.rsplit("/", 1)[1]

    page.locator("#job-head .badge[data-status=succeeded]").wait_for(timeout=400_000)
    # The time spent tuning, against the job's time budget, and what is left of it.
    assert "of 10 min 00 s" in page.locator("#tuning-time").inner_text()
    assert "time left" in page.locator("#tuning-remaining").inner_text()

    # The curve: one point per measured trial once every task has a measurement, drawn by uPlot.
    curve = httpx.get(f"{url}/api/v1/jobs/{job_id}/curve").json()
    expected = sum(1 for p in curve["points"] if p["estimate_us"] is not None)
    assert 0 < expected <= 8
    page.wait_for_function(
        f"document.querySelector('#curve-chart').dataset.points === '{expected}'", timeout=30_000
    )
    assert page.locator("#curve-chart canvas").count() >= 1
    # Its latency over tuning time, against onnxruntime's measured latency.
    legend = page.locator("#curve-chart .u-legend").inner_text()
    assert "Kiln, estimated" in legend and "onnxruntime (measured)" in legend, legend
    assert page.locator("#task-chart canvas").count() >= 1

    # The task table has both tasks and sorts by a column.
    rows = page.locator("#task-table tbody tr")
    assert rows.count() == 2
    page.click("#task-table th[data-key=trials]")
    assert page.locator("#task-table th.sorted-desc").count() == 1

    # Before/after bars: untuned, tuned and the onnxruntime reference.
    bars = page.locator("#latency-bars .bar")
    assert bars.count() == 3
    assert page.locator("#latency-bars .bar[data-name=onnxruntime]").count() == 1

    OUTPUT.mkdir(exist_ok=True)
    # Compiler view of the second task: TIR before, tuned TIR, trace, highlighted.
    second = page.locator("#compiler-task option").nth(1).get_attribute("value")
    page.select_option("#compiler-task", second)
    page.wait_for_function(
        "document.querySelector('#tir-tuned code.hljs') && "
        "document.querySelector('#tir-tuned').innerText.includes('prim_func')"
    )
    assert "sch." in page.locator("#trace").inner_text()
    assert "prim_func" in page.locator("#tir-before").inner_text()
    page.click("#graph-details summary")
    assert (
        "fused kernels" in page.locator("#graph-details").inner_text()
        or "kernels" in page.locator("#graph-details summary").inner_text()
    )

    # The Polyhedral tab of the same task: dependence summary and legality grid as tables, the best
    # schedule's tiles as bars against the caches (or why there are none), the space's pruning figures.
    page.click(".tabs button[data-tab=polyhedral]")
    page.locator("#poly-legality tbody tr").first.wait_for(timeout=60_000)
    assert page.locator("#compiler-view").is_hidden()
    assert "carried only by the reduction loop k" in page.locator("#poly-summary").inner_text()
    grid = page.locator("#poly-legality").inner_text()
    assert "reduction" in grid and "spatial" in grid
    assert "S0[" in page.locator("#poly-domain").inner_text()
    assert "cpu-poly" in page.locator("#poly-search").inner_text()
    assert page.locator("#poly-view .footprints .bar").count() + page.locator("#poly-no-tiles").count() >= 1
    page.screenshot(path=str(OUTPUT / "job-polyhedral.png"), full_page=True)
    # The Assembly tab: the kernel as compiled into the model, with its instruction mix.
    page.click(".tabs button[data-tab=assembly]")
    page.wait_for_function("(document.querySelector('#asm-mix')?.innerText || '').includes('FMAs')")
    assert page.locator("#poly-view").is_hidden() and "_compute_:" in page.locator("#asm-code").inner_text()
    page.click(".tabs button[data-tab=schedule]")
    assert page.locator("#poly-view").is_hidden() and page.locator("#compiler-view").is_visible()
    assert page.locator("#asm-view").is_hidden()

    # The lowering, pass by pass: FuseTIR's program beside the level before it, its changes marked.
    steps = page.locator("#lowering-steps button")
    steps.first.wait_for(timeout=60_000)
    assert steps.count() >= 10 and "imported" in steps.first.inner_text()
    page.locator("#lowering-steps button", has_text="FuseTIR").first.click()
    page.wait_for_function(
        "(document.querySelector('#lowering-summary')?.innerText || '').includes('FuseTIR')"
    )
    page.locator("#lowering-diff").wait_for()
    assert (
        page.locator("#lowering-diff td.add").count() > 0
        and page.locator("#lowering-diff td.del").count() > 0
    )
    assert "call_tir" in page.locator("#lowering-diff").inner_text()
    page.locator("#lowering").screenshot(path=str(OUTPUT / "job-lowering.png"))
    # ... then one kernel down to the CPU: its tuned TIR beside the TIR before scheduling, its assembly.
    kernel_steps = page.locator("#lowering-kernel-steps button")
    assert [kernel_steps.nth(i).inner_text() for i in range(kernel_steps.count())] == [
        "TIR (before scheduling)",
        "Tuned TIR",
        "Assembly",
    ]
    assert page.locator("#lowering-task option").count() == 2
    kernel_steps.nth(1).click()
    page.wait_for_function(
        "(document.querySelector('#lowering-summary')?.innerText || '').includes('tuned TIR')"
    )
    page.locator("#lowering-diff").wait_for()
    assert page.locator("#lowering-diff td.add").count() > 0
    assert kernel_steps.nth(1).get_attribute("aria-current") == "step"
    kernel_steps.nth(2).click()
    page.wait_for_function("(document.querySelector('#lowering-summary')?.innerText || '').includes('FMAs')")
    assert "_compute_:" in page.locator("#lowering-text").inner_text()

    # The profile: each kernel under this machine's roofline, and a table sortable by any column.
    page.locator("#profile-table tbody tr").first.wait_for(timeout=60_000)
    assert page.locator("#roofline canvas").count() >= 1
    assert "FMA peak" in page.locator("#profile-machine").inner_text()
    assert "onnxruntime:" in page.locator("#profile-totals").inner_text()
    rows = page.locator("#profile-table tbody tr")
    assert rows.count() >= 3  # two kernels and the VM's own work
    first_times = [
        float(t) for t in page.locator("#profile-table tbody tr td:nth-child(3)").all_inner_texts()
    ]
    assert first_times == sorted(first_times, reverse=True)  # by time, largest first
    page.click("#profile-table th[data-key=name]")
    names = page.locator("#profile-table tbody tr td:nth-child(1)").all_inner_texts()
    assert names == sorted(names) and page.get_attribute("#profile-table th[data-key=name]", "aria-sort") == (
        "ascending"
    )
    page.click("#profile-table th[data-key=total_us]")
    # The card's figures agree, or it says plainly that they were disturbed, with the API's reasons.
    profile = httpx.get(f"{url}/api/v1/jobs/{job_id}/profile").json()
    shown = page.locator("#profile-disturbed li").all_inner_texts()
    assert shown == profile["warnings"] and profile["disturbed"] == bool(shown)
    assert any(k["tuned_best_us"] for k in profile["kernels"])
    page.locator("#profile").screenshot(path=str(OUTPUT / "job-roofline.png"))

    # At 1400 px nothing in the task table, the compiler view or the profile is cut off.
    for card in ("#task-table", "#compiler-view", "#profile-table"):
        assert _overflow(page, card) <= 0, card
    page.click(".tabs button[data-tab=polyhedral]")
    page.locator("#poly-legality tbody tr").first.wait_for(timeout=60_000)
    assert _overflow(page, "#poly-legality") <= 0
    page.click(".tabs button[data-tab=schedule]")

    page.screenshot(path=str(OUTPUT / "job-page.png"), full_page=True)

    with page.expect_download() as download_info:
        page.click("#download-artifact")
    artifact = tmp_path / "downloaded.tar.gz"
    download_info.value.save_as(str(artifact))
    with tarfile.open(artifact, "r:gz") as tar:
        assert {"model.so", "manifest.json", "run.py"} <= set(tar.getnames())

    # A job that fails (its model's file lost from the server's disk) says why, in one line, in the list.
    other = tmp_path / "other.onnx"
    onnx.save(build_mlp(seed=22), str(other))
    with other.open("rb") as fh:
        lost = httpx.post(f"{url}/api/v1/models", files={"file": ("other.onnx", fh)}, timeout=60).json()
    data_dir = Path(start_server.data_dirs[url])  # type: ignore[attr-defined]
    next(data_dir.rglob(f"{lost['sha256']}*")).unlink()
    failed = httpx.post(f"{url}/api/v1/jobs", json={"model_id": lost["id"], "trials": 4}).json()

    # Back on the jobs list, the job is there with its speedup over onnxruntime, then over untuned TVM.
    page.click("text=Jobs")
    row = page.locator(f"#jobs-table tr[data-job='{job_id}']")
    row.wait_for()
    text = row.inner_text()
    assert "succeeded" in text and "× untuned" in text and "onnxruntime" in text
    failed_row = page.locator(f"#jobs-table tr[data-job='{failed['id']}']")
    failed_row.locator(".badge[data-status=failed]").wait_for(timeout=120_000)
    reason = failed_row.locator(".reason").inner_text()
    assert reason == httpx.get(f"{url}/api/v1/jobs/{failed['id']}").json()["error"]
    assert (
        "the stored file of model 'other' is missing" in reason
        and "Traceback" not in reason
        and str(data_dir) not in reason
    )
    assert _overflow(page, "#jobs-table") <= 0
    page.screenshot(path=str(OUTPUT / "jobs-list.png"), full_page=True)


def _overflow(page, selector: str) -> int:
    """How many pixels the card holding ``selector`` would need to scroll sideways (> 0: cut off)."""
    return page.evaluate(
        "(s) => { const c = document.querySelector(s).closest('.card'); return c.scrollWidth - c.clientWidth; }",
        selector,
    )


def test_a_bf16_job_page_says_how_it_computed_and_how_accurate_it_is(
    start_server: Callable[..., str], browser_page, tmp_path: Path
) -> None:
    """A job under the bf16 policy, made over the API: its page shows the policy, the reduced operators
    and how this CPU computed them, and the norm-wise accuracy against the float32 model."""
    page = browser_page
    url = start_server()
    model_path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(seed=23), str(model_path))
    with httpx.Client(base_url=url, timeout=60) as http:
        with model_path.open("rb") as fh:
            model = http.post("/api/v1/models", files={"file": ("mlp.onnx", fh)}).json()
        created = http.post("/api/v1/jobs", json={"model_id": model["id"], "trials": 4, "precision": "bf16"})
        assert created.status_code == 202, created.text
        job_id = created.json()["id"]

    page.goto(f"{url}/#/jobs/{job_id}")
    page.locator("#job-head .badge[data-status=succeeded]").wait_for(timeout=400_000)
    accuracy = page.locator("#accuracy").inner_text()
    assert "Accuracy against onnxruntime (float32)" in accuracy and "relative error allowed" in accuracy
    rows = page.locator("#accuracy tbody tr")
    assert rows.count() == 1  # the one output: its relative error is given, in exponent form
    assert "e-" in rows.first.locator("td").nth(3).inner_text()
    page.click("#graph-details summary")
    note = page.locator("#precision").inner_text()
    assert "Precision bf16: 2 matmul/convolutions on bf16 operands with fp32 accumulation" in note
    assert any(mode in note for mode in ("emulated:", "mixed:", "native:")), note
    assert "matmul 1x256 @ 256x512 -> bf16" in note


def test_an_upload_binds_a_graphs_parameter_inputs(
    start_server: Callable[..., str], browser_page, tmp_path: Path
) -> None:
    page = browser_page
    url = start_server()
    path = parameterized_onnx(tmp_path / "topk.onnx")
    page.goto(url + "/#/submit")
    page.set_input_files("#model-file", str(path))
    page.fill("#input-values", json.dumps(PARAMETER_VALUES))
    page.click("#upload-form button[type=submit]")
    page.locator("#model-ready").wait_for()
    rows = page.locator("#model-ready + table tbody tr").all_inner_texts()
    assert [r.split("\t")[:2] for r in rows if r.startswith("input")] == [["input", "x"]]
    assert any(r.startswith("bound\tk\t[1] = [2]") for r in rows), rows


def test_the_page_asks_for_a_token_and_says_when_it_is_wrong(
    start_server: Callable[..., str], browser_page
) -> None:
    page = browser_page
    url = start_server(KILN_API_TOKENS="ada:right-token")
    page.goto(url + "/#/models")
    dialog = page.locator("#login")
    dialog.wait_for()
    assert "requires an API token" in page.locator("#login-message").inner_text()

    page.fill("#login-token", "wrong-token")
    page.click("#login-form button[type=submit]")
    page.wait_for_function("document.querySelector('#login').open")
    assert "refused the token" in page.locator("#login-message").inner_text()

    page.fill("#login-token", "right-token")
    page.click("#login-form button[type=submit]")
    page.get_by_text("No model yet").wait_for()
    assert not page.evaluate("document.querySelector('#login').open")


def test_the_devices_page_shows_which_running_job_measures_on_which_server(
    start_server: Callable[..., str], browser_page
) -> None:
    page = browser_page
    with (
        start_tracker("127.0.0.1", 0) as tracker,
        start_server_process(tracker.address, "board", "127.0.0.1", 0),
    ):
        url = start_server(KILN_RPC_TRACKER=tracker.address, KILN_EMBEDDED_WORKERS="0")
        store = Store.from_settings(Settings(data_dir=Path(start_server.data_dirs[url]), database_url=None))
        job = add_job(store)
        store.mark_job_running(job, "w1")
        store.note_server_use(job, "board", {"10.0.0.7:9090": 3})
        page.goto(url + "/#/devices")
        page.locator("#server-use-table").wait_for()
        row = page.locator("#devices-table tbody tr").first.inner_text().split()
        assert row == ["board", "1", "1", "0", "1"]  # key, servers, free, pending, running jobs
        cells = page.locator("#server-use-table tbody tr").first.inner_text().split("\t")
        assert [c.strip() for c in cells[:4]] == ["board", "10.0.0.7:9090", job[:8], "3"]
        assert cells[4].strip().endswith("s ago")


def test_api_docs_render_offline(start_server: Callable[..., str], browser_page) -> None:
    """/docs is Kiln's own Swagger UI: with every request off this server refused (no internet, no CDN),
    the page lists the API's operations."""
    page = browser_page
    url = start_server()
    elsewhere: list[str] = []

    def only_this_server(route) -> None:
        if route.request.url.startswith(url):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_this_server)
    page.goto(f"{url}/docs")
    page.locator(".swagger-ui .opblock").first.wait_for()
    operations = page.locator(".swagger-ui .opblock-summary-path").all_inner_texts()
    assert "/api/v1/jobs/{job_id}/artifact" in [o.replace("\u200b", "") for o in operations]
    assert len(operations) > 20
    assert "Kiln" in page.locator(".swagger-ui .info .title").inner_text()
    assert elsewhere == []


def test_a_split_jobs_page_lists_its_task_groups_and_their_workers(
    start_server: Callable[..., str], browser_page
) -> None:
    page = browser_page
    url = start_server(KILN_EMBEDDED_WORKERS="0")
    store = Store.from_settings(Settings(data_dir=Path(start_server.data_dirs[url]), database_url=None))
    model = add_model(store)
    job = store.create_job(spec_for(model.id, workers=2), TARGET).id
    store.split_job(job, [([0, 2], 20), ([1], 12)], None)
    store.mark_job_running(job, "node-a:17")
    store.claim_task_group("node-b:42")
    page.goto(f"{url}/#/jobs/{job}")
    page.locator("#task-groups table").wait_for()
    assert "Tasks split over 2 groups" in page.locator("#task-groups h3").inner_text()
    rows = [r.split("\t") for r in page.locator("#task-groups tbody tr").all_inner_texts()]
    assert [[c.strip() for c in r[:6]] for r in rows] == [
        ["#0", "#0, #2", "20", "running", "node-b:42", "1"],
        ["#1", "#1", "12", "queued", "–", "0"],
    ]


def test_an_int8_job_from_the_form_with_calibration_inputs(
    start_server: Callable[..., str], browser_page, tmp_path: Path
) -> None:
    """The form's precision field explains the chosen policy in a line and fits its card at 1400 px; int8
    asks for calibration inputs and a budget, uploads the .npz, and the job page shows how Kiln quantized
    the float model."""
    import numpy as np

    from tests.model_builders import build_small_cnn

    page = browser_page
    url = start_server()
    model_path = tmp_path / "cnn.onnx"
    onnx.save(build_small_cnn(batch=1, image_size=16), str(model_path))
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, x=np.random.default_rng(2).standard_normal((12, 3, 16, 16)).astype(np.float32))

    page.goto(url + "/#/submit")
    page.set_input_files("#model-file", str(model_path))
    page.click("#upload-form button[type=submit]")
    page.locator("#model-ready").wait_for()
    # auto, the default, takes calibration inputs (and becomes int8 with them); as-is does not.
    assert page.locator("#precision").input_value() == "auto" and page.locator("#int8-fields").is_visible()
    page.select_option("#precision", "as-is")
    assert (
        page.locator("#int8-fields").is_hidden()
        and "own precision" in page.locator("#precision-line").inner_text()
    )
    assert _overflow(page, "#precision") <= 0
    page.select_option("#precision", "int8")
    assert "quantized" in page.locator("#precision-line").inner_text()
    assert page.locator("#int8-fields").is_visible() and _overflow(page, "#int8-fields") <= 0
    page.set_input_files("#calibration-file", str(inputs))
    page.fill("#trials", "4")
    page.click("#start-job")
    page.wait_for_url("**/#/jobs/*")
    page.locator("#job-head .badge[data-status=succeeded]").wait_for(timeout=400_000)
    quantization = page.locator("#quantization").inner_text()
    assert "Quantized by Kiln: 4 of 4 convolutions/matmuls in int8" in quantization, quantization
    assert "6 calibration and 6 validation samples from the user's calibration file" in quantization
    assert "held" in quantization and page.locator("#synthetic-calibration").count() == 0
    assert page.locator("#returned").inner_text() == "none"
    assert "Returned to float32" in quantization  # the API's returned_precision (bf16 on bf16 CPUs)
    # int8 by name: no operator is timed against float (auto's per-operator choice), and the page says why.
    assert "precision int8 was asked for by name" in page.locator("#speed-note").inner_text()
