"""The ``kiln`` console script, run as a user runs it (a subprocess), on the bundled examples."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tests.artifacts import run_artifact_in_fresh_process
from tests.jax_models import export_jax, jax_cnn, jax_outputs
from tests.model_builders import build_torch_mlp, save_torch_program
from tuner.settings import Settings
from tuner.store import Store

# Every test here starts `kiln` processes (TVM loaded in each): seconds each, minutes for the tuning ones.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MLP = REPO / "examples" / "mlp.onnx"
CNN = REPO / "examples" / "small_cnn.onnx"


#: ``python -c`` that runs the ``kiln`` command of its arguments, says on stderr which heavy modules it
#: loaded, and fails it (status 3) if it loaded any: loading TVM costs seconds, and a command that only
#: reads the store starts without it.
LIGHT = """
import sys

from cli.main import main

sys.argv[0] = "kiln"
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("tvm", "tvm_ffi", "torch", "onnxruntime", "xgboost") if m in sys.modules)
print(f"heavy modules loaded: {heavy}", file=sys.stderr)
sys.exit(3 if heavy else code)
"""


def kiln(
    *args: str,
    data_dir: Path,
    timeout: float = 600,
    light: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``kiln ARGS`` as a user would (``env``: KILN_* settings besides the tests' own); ``light``: and
    fail it (status 3) if it loads TVM or another heavy module (:data:`LIGHT`)."""
    env = {**os.environ, "KILN_DATA_DIR": str(data_dir), "COLUMNS": "200", **(env or {})}
    env.pop("KILN_DATABASE_URL", None)
    command = ["-c", LIGHT] if light else ["-m", "cli"]
    return subprocess.run(
        [sys.executable, *command, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=REPO,
    )


def test_tasks_prints_the_fused_kernels_without_tuning(tmp_path: Path) -> None:
    done = kiln("tasks", str(MLP), data_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "fused_matmul_add_relu" in done.stdout
    assert "5 Relax operators -> 2 fused kernels" in done.stdout
    assert not (tmp_path / "kiln.db").exists()  # a preview stores nothing


def test_tasks_show_tir_prints_unscheduled_tir_exactly(tmp_path: Path) -> None:
    from tuner.frontend import load_model
    from tuner.passes.plan import plan_graph
    from tuner.settings import Settings
    from tuner.targets import resolve_target, to_tvm_target

    done = kiln("tasks", str(MLP), "--show-tir", "0", data_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = done.stdout[done.stdout.index("# from tvm.script import") :]
    # The task's TIR as the planner holds it, character for character: brackets (buffer indices,
    # T.axis.remap's list) are not taken for markup, long lines are not wrapped.
    settings = Settings()
    target = to_tvm_target(resolve_target("host"))
    plan = plan_graph(load_model(MLP, {}).mod, target, settings.planning_options())
    assert printed.rstrip("\n") == plan.infos[0].tir.rstrip("\n")
    assert 'T.axis.remap("SSR", [' in printed


def test_tasks_poly_prints_each_tasks_polyhedral_analysis(tmp_path: Path) -> None:
    done = kiln("tasks", str(CNN), "--poly", data_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count("domain: {") >= 2 and "S0[" in out  # isl's notation, brackets and all
    assert "dependences: carried only by the reduction loops" in out
    assert "loops: what the dependences allow" in out and "rfactor" in out
    assert "RAW" in out and "textual order" in out
    assert "can be computed at depth" in out
    assert "caches (" in out


def test_corrupt_model_exits_2_with_the_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model at all")
    done = kiln("tune", str(bad), "--trials", "4", data_dir=tmp_path)
    assert done.returncode == 2
    assert "invalid_model" in done.stderr and "bad.onnx" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["submit", "tune"])
def test_unknown_cost_model_exits_2_and_queues_nothing(tmp_path: Path, command: str) -> None:
    # Refused before TVM loads (the light probe exits 3 if it did): at once, not seconds later.
    done = kiln(command, str(MLP), "--trials", "4", "--cost-model", "foo", data_dir=tmp_path, light=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unknown cost model 'foo'" in done.stderr and "'xgb'" in done.stderr
    assert not (tmp_path / "models").exists()  # refused before the model was imported and stored
    jobs = kiln("jobs", data_dir=tmp_path)
    assert jobs.returncode == 0 and "foo" not in jobs.stdout


@pytest.mark.parametrize("command", ["submit", "tune"])
def test_an_owner_without_a_token_is_refused_before_tvm_loads(tmp_path: Path, command: str) -> None:
    done = kiln(command, str(MLP), "--trials", "0", "--owner", "erin", data_dir=tmp_path, light=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no API token is named 'erin'" in " ".join(done.stderr.split())  # rich wraps long lines
    assert not (tmp_path / "models").exists()


def test_unknown_precision_exits_2_before_storing_anything(tmp_path: Path) -> None:
    done = kiln("tune", str(MLP), "--trials", "4", "--precision", "int4", data_dir=tmp_path, light=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unknown precision 'int4'" in done.stderr and "bf16" in done.stderr
    assert not (tmp_path / "models").exists()


def test_bad_target_exits_2_before_storing_anything(tmp_path: Path) -> None:
    done = kiln("tune", str(MLP), "--target", '{"kind": "nope"}', data_dir=tmp_path)
    assert done.returncode == 2
    assert "invalid_target" in done.stderr and "'nope' is not supported" in done.stderr
    assert not (tmp_path / "models").exists()


def test_bad_input_shape_syntax_exits_2(tmp_path: Path) -> None:
    done = kiln("tasks", str(MLP), "--input-shape", "x=1xAx3", data_dir=tmp_path)
    assert done.returncode == 2
    assert "--input-shape" in done.stderr


def test_input_values_bind_a_graphs_parameters(tmp_path: Path) -> None:
    from tests.model_builders import PARAMETER_VALUES, parameterized_onnx

    path = parameterized_onnx(tmp_path / "topk.onnx")
    values = [f"--input-value={name}={json.dumps(v)}" for name, v in PARAMETER_VALUES.items()]
    done = kiln("tasks", str(path), *values, data_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "topk" in done.stdout
    unbound = kiln("tasks", str(path), data_dir=tmp_path)
    assert unbound.returncode == 2 and "Reshape" in unbound.stderr
    bad = kiln("tasks", str(path), "--input-value", "k", data_dir=tmp_path)
    assert bad.returncode == 2 and "expected NAME=JSON" in bad.stderr


def test_db_upgrade_and_current(tmp_path: Path) -> None:
    done = kiln("db", "upgrade", data_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    current = json.loads(kiln("db", "current", data_dir=tmp_path).stdout)
    assert current["current"] == current["head"] is not None


@pytest.mark.slow
def test_tune_then_reuse_records_then_export(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Profiled (tests/conftest.py turns profiles off): `kiln profile` reads this job's profile below.
    done = kiln(
        "tune",
        str(MLP),
        "--trials",
        "6",
        "--out",
        str(out),
        data_dir=tmp_path,
        env={"KILN_PROFILE_BUDGET_S": "2"},
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert re.search(
        r"Kiln tuned [\d.]+ ms: [\d.]+x (faster|slower) than onnxruntime \([\d.]+ ms\); [\d.]+x faster than untuned TVM",
        done.stdout,
    ), done.stdout
    assert "verified vs onnxruntime" in done.stdout
    (artifact,) = out.glob("mlp-*.tar.gz")
    with tarfile.open(artifact) as tar:
        assert "model.so" in tar.getnames()

    listing = kiln("jobs", data_dir=tmp_path, light=True)
    assert listing.returncode == 0 and "succeeded" in listing.stdout
    job_id = json.loads(tar_manifest(artifact))["job_id"]
    assert artifact.name == f"mlp-{job_id[:8]}.tar.gz"  # the name the API's download gives it

    warm = kiln("tune", str(MLP), "--trials", "0", data_dir=tmp_path)
    assert warm.returncode == 0, warm.stderr
    assert "2/2 tasks start warm" in warm.stdout

    status = kiln("status", job_id, data_dir=tmp_path, light=True)
    assert status.returncode == 0 and "succeeded" in status.stdout
    # The latency over tuning time against onnxruntime: a first-trial row, and one after the last trial.
    assert "latency over tuning time" in status.stdout and "onnxruntime ms / Kiln ms" in status.stdout
    assert "first trial" in status.stdout

    lowering = kiln("ir", job_id, data_dir=tmp_path, light=True)
    assert lowering.returncode == 0, lowering.stderr
    assert "imported" in lowering.stdout and "LegalizeOps" in lowering.stdout and "FuseTIR" in lowering.stdout
    fused = kiln("ir", job_id, "FuseTIR", data_dir=tmp_path, light=True)
    assert fused.returncode == 0 and fused.stdout.startswith("# level ") and "R.call_tir" in fused.stdout
    unknown = kiln("ir", job_id, "NoSuchPass", data_dir=tmp_path, light=True)
    assert unknown.returncode == 2 and "0 imported" in unknown.stderr
    kernel = kiln("ir", job_id, "--asm", "0", data_dir=tmp_path, light=True)
    assert kernel.returncode == 0, kernel.stderr
    assert kernel.stdout.startswith("# ") and "FMAs:" in kernel.stdout and "_compute_:" in kernel.stdout

    profiled = kiln("profile", job_id, data_dir=tmp_path, light=True)
    assert profiled.returncode == 0, profiled.stderr
    assert "GFLOP/s" in profiled.stdout and "this machine: fp32 FMA peak" in profiled.stdout
    assert "onnxruntime:" in profiled.stdout and "VM runtime" in profiled.stdout
    as_json = json.loads(kiln("profile", job_id, "--json", data_dir=tmp_path).stdout)
    assert as_json["kernels"] and as_json["limits"]["peak_gflops"] > 0
    bad_sort = kiln("profile", job_id, "--sort", "colour", data_dir=tmp_path)
    assert bad_sort.returncode == 2 and "--sort" in bad_sort.stderr

    exported = kiln("export", job_id, "--out", str(tmp_path / "exported"), data_dir=tmp_path, light=True)
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "exported" / artifact.name).read_bytes() == artifact.read_bytes()

    records = tmp_path / "records"
    exported = kiln("export", job_id, "--what", "records", "--out", str(records), data_dir=tmp_path)
    assert exported.returncode == 0, exported.stderr
    lines = (records / "database_tuning_record.json").read_text().splitlines()
    assert 0 < len(lines) <= 6

    missing = kiln("status", "no-such-job", data_dir=tmp_path, light=True)
    assert missing.returncode == 2 and "not_found" in missing.stderr


def test_tune_with_a_time_budget_stops_then_compiles_and_verifies(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = kiln("tune", str(CNN), "--time", "20s", "--out", str(out), data_dir=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "verified vs onnxruntime" in done.stdout
    assert "of a 20s budget" in done.stdout  # the elapsed and remaining time, as the job ends
    (artifact,) = out.glob("small_cnn-*.tar.gz")
    manifest = json.loads(tar_manifest(artifact))
    budget = manifest["budget"]
    assert budget["trials"] is None and budget["time_s"] == 20.0  # --time alone: no trial limit
    # With no trial limit only the budget ends the search: that it ended, having measured, is the check
    # here (the rule that starts no batch past the budget is tests/unit/test_tune_budget.py's; a shared
    # machine's wall clock bounds nothing).
    assert budget["trials_measured"] > 0 and budget["tuning_s"] > 0
    assert all(check["ok"] for check in manifest["verification"]["checks"])

    status = kiln("status", manifest["job_id"], data_dir=tmp_path)
    assert status.returncode == 0 and "s left of a 20s budget" in status.stdout
    listing = kiln("jobs", data_dir=tmp_path)
    assert f"{budget['trials_measured']}/-" in listing.stdout

    bad = kiln("tune", str(CNN), "--time", "soon", data_dir=tmp_path)
    assert bad.returncode == 2 and "--time must be a positive duration" in bad.stderr


def tar_manifest(artifact: Path) -> str:
    with tarfile.open(artifact) as tar:
        return tar.extractfile("manifest.json").read().decode()


def test_submit_queues_a_job_for_the_workers_and_cancel_cancels_it(tmp_path: Path) -> None:
    # A worker with nothing to do exits at once with --once; starting, it checked this machine's target.
    idle = kiln("worker", "--once", data_dir=tmp_path, timeout=120)
    assert idle.returncode == 0, idle.stderr

    # So the first submission loads no TVM itself (the light probe exits 3 if it did): only the importer's
    # sandbox, a process of its own, loads it to import the new model.
    submitted = kiln("submit", str(MLP), "--trials", "8", "--seed", "3", data_dir=tmp_path, light=True)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.split("queued job ", 1)[1].split()[0]
    assert "queued" in kiln("jobs", data_dir=tmp_path).stdout

    # The same model again: its bytes are stored as they are, so it is not imported again either.
    again = kiln("submit", str(MLP), "--trials", "8", "--seed", "4", data_dir=tmp_path, light=True)
    assert again.returncode == 0, again.stdout + again.stderr
    second_id = again.stdout.split("queued job ", 1)[1].split()[0]
    store = Store.from_settings(Settings(data_dir=tmp_path, database_url=None))
    first, second = store.get_job(job_id), store.get_job(second_id)
    assert second_id != job_id and second.spec.model_id == first.spec.model_id
    assert (second.target_key, second.spec.target, second.spec.space) == (
        first.target_key,
        first.spec.target,
        first.spec.space,
    )
    assert second.spec.seed == 4 and len(store.list_models()) == 1
    assert kiln("cancel", second_id, data_dir=tmp_path).returncode == 0
    # Calibration inputs for the int8 policy (the default, auto, becomes int8 with them): checked against the
    # model's inputs, kept, named by the job; still without TVM. A file of another input is refused.
    import numpy as np

    inputs, wrong = tmp_path / "inputs.npz", tmp_path / "wrong.npz"
    np.savez(inputs, x=np.zeros((4, 256), np.float32))
    np.savez(wrong, image=np.zeros((4, 256), np.float32))
    quantized = kiln(
        "submit",
        str(MLP),
        "--trials",
        "0",
        "--calibration",
        str(inputs),
        "--max-top1-changed",
        "0.02",
        data_dir=tmp_path,
        light=True,
    )
    assert quantized.returncode == 0, quantized.stdout + quantized.stderr
    job = store.get_job(quantized.stdout.split("queued job ", 1)[1].split()[0])
    assert job.spec.precision == "auto" and job.spec.calibration_id is not None
    assert job.spec.accuracy_budget.max_top1_changed == 0.02
    assert kiln("cancel", job.id, data_dir=tmp_path).returncode == 0
    refused = kiln("submit", str(MLP), "--calibration", str(wrong), data_dir=tmp_path, light=True)
    assert refused.returncode == 2 and "invalid_calibration" in refused.stderr, refused.stderr
    assert "['image'] are not inputs of the model" in " ".join(refused.stderr.split())
    budget = kiln("submit", str(MLP), "--max-top1-changed", "2", data_dir=tmp_path, light=True)
    assert budget.returncode == 2 and "max_top1_changed" in budget.stderr
    # A target this machine has not checked loads TVM to check it, and a bad one is refused as before.
    bad = kiln(
        "submit", str(MLP), "--trials", "8", "--target", '{"kind": "llvm", "mcpu": "nope"}', data_dir=tmp_path
    )
    assert bad.returncode == 2 and "does not know the CPU 'nope'" in " ".join(bad.stderr.split())

    cancelled = kiln("cancel", job_id, data_dir=tmp_path)
    assert cancelled.returncode == 0 and f"job {job_id}: cancelled" in cancelled.stdout
    again = kiln("cancel", job_id, data_dir=tmp_path)
    assert again.returncode == 2 and "already finished" in again.stderr


@pytest.mark.serial  # it measures this machine's roofs
def test_machine_measures_the_roofs_of_this_cpu(tmp_path: Path) -> None:
    done = kiln("machine", "--json", data_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    limits = json.loads(done.stdout)
    assert limits["peak_gflops"] > 0 and limits["bandwidth_gbs"] > 0
    assert "STREAM triad" in limits["how"] and limits["measured_at"]
    # The int8 and bf16 peaks on this CPU's own dot products, where it has them.
    from tuner.entities.profile import LIMITS_VERSION
    from tuner.targets import host_target
    from tuner.timing.dot_peaks import target_dot_products

    dots = target_dot_products(host_target())
    assert limits["version"] == LIMITS_VERSION
    for precision, figure in (("int8", "int8_gops"), ("bf16", "bf16_gflops")):
        if precision in dots:
            assert limits[figure] > 0 and limits[f"{precision}_instruction"] == dots[precision].instruction
        else:
            assert limits[figure] is None and limits[f"{precision}_instruction"] is None
    # Measured once per host: the next call reads what was kept (limits measured while other processes
    # kept the CPUs busy are measured again, and the best of both kept); --measure measures again.
    kept = json.loads(kiln("machine", "--json", data_dir=tmp_path).stdout)
    if limits["disturbed"]:
        assert kept["measurements"] == 2 and kept["peak_gflops"] >= limits["peak_gflops"]
    else:
        assert kept == limits
    table = kiln("machine", data_dir=tmp_path).stdout
    assert ("int8 peak" in table) == ("int8" in dots) and ("bf16 peak" in table) == ("bf16" in dots)
    again = json.loads(kiln("machine", "--json", "--measure", data_dir=tmp_path).stdout)
    assert again["measured_at"] > limits["measured_at"] and again["host"] == limits["host"]


def test_machine_refuses_a_cpu_it_does_not_run_on(tmp_path: Path) -> None:
    done = kiln("machine", "--target", '{"kind": "cuda"}', data_dir=tmp_path)
    assert done.returncode == 2
    assert "does not run on this machine" in done.stderr


@pytest.mark.parametrize(
    "command", [["--help"], ["jobs"], ["models"], ["status", "no-such-job"], ["db", "current"]]
)
def test_commands_that_only_read_the_store_do_not_load_tvm(tmp_path: Path, command: list[str]) -> None:
    """Loading TVM costs seconds: a command that reads the store starts without it (so do `kiln status`,
    `ir`, `profile` and `export` of a finished job: test_tune_then_reuse_records_then_export)."""
    done = kiln(*command, data_dir=tmp_path, timeout=120, light=True)
    assert "heavy modules loaded: []" in done.stderr, done.stderr


@pytest.mark.parametrize("fmt", ["pt2", "jax"])
def test_tune_takes_a_torch_export_and_a_jax_export(fmt: str, tmp_path: Path) -> None:
    """``kiln tune`` on the two program formats beside ONNX; each artifact computes what its framework does."""
    if fmt == "pt2":
        torch = pytest.importorskip("torch")
        module = build_torch_mlp(seed=3)
        x = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)
        path = save_torch_program(module, (torch.from_numpy(x),), tmp_path / "model.pt2")
        with torch.no_grad():
            expected = module(torch.from_numpy(x)).numpy()
    else:
        pytest.importorskip("jax")
        program = jax_cnn(size=16, seed=3)
        path = export_jax(program, tmp_path / "model.jax")
        x = program[2](np.random.default_rng(3))
        (expected,) = jax_outputs(program, x)
    out = tmp_path / "out"
    done = kiln("tune", str(path), "--trials", "4", "--out", str(out), data_dir=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "verified vs untuned TVM" in done.stdout, done.stdout  # no onnxruntime for these formats
    (artifact,) = out.glob("model-*.tar.gz")
    assert (
        json.loads(tar_manifest(artifact))["model"]["format"]
        == {"pt2": "torch-export", "jax": "jax-export"}[fmt]
    )
    got = run_artifact_in_fresh_process(artifact, x, tmp_path)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
