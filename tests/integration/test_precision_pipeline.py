"""A float model tuned under the bf16 policy end to end: its matmuls tuned on bf16 operands, verified
norm-wise against the float32 model, the policy and its accuracy in the job, the API and the manifest,
and an artifact plain TVM loads."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from schedules.amx import has_amx_bf16
from schedules.vnni import has_avx512_bf16
from service.schemas import JobOut
from tests.artifacts import onnxruntime_output, rounded_operands_output, run_artifact_in_fresh_process
from tests.host_jobs import run_host_job
from tests.model_builders import (
    build_attention_scores,
    build_bottleneck,
    build_cancelling_matmuls,
    build_mlp,
    build_small_cnn,
)
from tuner.entities import JobStatus
from tuner.isolation.sandbox import ModelSandbox
from tuner.jobs.pipeline import JobResult
from tuner.passes.precision import RELATIVE_TOLERANCE, native_bf16
from tuner.settings import Settings
from tuner.store import Store
from tuner.targets import host_target, to_tvm_target
from tuner.views.inspection import best_schedule, plan_model

pytestmark = pytest.mark.slow

#: Each policy's low-precision type and its unit roundoff.
ROUNDED_TO = {"bf16": onnx.TensorProto.BFLOAT16, "fp16": onnx.TensorProto.FLOAT16}
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}
#: How far the artifact may be from the run on rounded operands, in unit roundoffs: the two differ only in
#: the order of their fp32 sums.
SUM_ORDER_FRACTION = 1 / 16
#: This CPU's bf16 instructions: where it has none, ``auto`` plans as-is without a check to make.
HOST_BF16 = native_bf16(to_tvm_target(host_target()))
NO_HOST_BF16 = "this CPU has no bf16 instructions, so auto plans as-is (tests/unit/test_precision.py plans auto for CPUs with them)"


def _tuned_reduced_job(
    store: Store, tmp_path: Path, model: onnx.ModelProto, path: Path, trials: int, precision: str = "bf16"
) -> JobResult:
    """``model`` saved at ``path``, stored, and tuned for ``trials`` under the ``precision`` policy: a
    succeeded job."""
    settings = Settings(data_dir=tmp_path, database_url=None)
    onnx.save(model, path)
    result = run_host_job(store, settings, path, trials=trials, precision=precision)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    return result


def _manifest(result: JobResult) -> dict[str, Any]:
    with tarfile.open(result.artifact.path, "r:gz") as tar:  # type: ignore[union-attr]
        return json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]


def _assert_artifact_within_reduced_tolerance(
    result: JobResult, model: Path, x: np.ndarray, tmp_path: Path, precision: str = "bf16"
) -> None:
    """The job's artifact, run by plain TVM in a fresh process, is within the policy's norm-wise tolerance
    of onnxruntime's float32 run of the model, and within a small fraction of one unit roundoff of the same
    run with the matmuls' and convolutions' operands rounded to the low precision: the policy's tolerance
    (16 units: 6 % for bf16) leaves room for deep models, and would let a wrong kernel 5 % off pass on a
    small one, while only the order of the fp32 sums separates the artifact from the rounded run."""
    got = run_artifact_in_fresh_process(Path(result.artifact.path), x, tmp_path)  # type: ignore[union-attr]
    want = onnxruntime_output(model, x)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= RELATIVE_TOLERANCE[precision]
    rounded = rounded_operands_output(model, x, ROUNDED_TO[precision])
    error = np.linalg.norm(got - rounded) / np.linalg.norm(rounded)
    assert error <= SUM_ORDER_FRACTION * UNIT_ROUNDOFF[precision], error


#: A task's best schedule in a fresh interpreter: data dir, job id, task id.
SHOW_BEST = """
import sys
from pathlib import Path
from tuner.views.inspection import best_schedule
from tuner.settings import Settings
from tuner.store import Store
store = Store(Settings(data_dir=Path(sys.argv[1]), database_url=None).resolved_database_url)
job = store.get_job(sys.argv[2])
(task,) = [t for t in store.list_tasks(job.id) if t.id == int(sys.argv[3])]
print(best_schedule(store, job, task).tir)
"""


def test_a_bf16_job_tunes_bf16_matmuls_and_is_verified_against_the_float_model(
    sqlite_store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "mlp.onnx"
    result = _tuned_reduced_job(sqlite_store, tmp_path, build_mlp(batch=4), path, trials=6)
    assert result.job.spec.precision == "bf16"
    assert result.fusion.reduced_ops == ["matmul 4x256 @ 256x512 -> bf16", "matmul 4x512 @ 512x10 -> bf16"]

    # The tuned kernel reads the weights as bf16 (TVM stores them as uint16 after BF16StorageLegalize or
    # keeps bfloat16 in the TIR) and accumulates in float32.
    matmul = max(result.tasks, key=lambda t: t.flops)
    tuned = best_schedule(sqlite_store, result.job, matmul).tir
    assert '"bfloat16"' in tuned, tuned

    # Verified norm-wise against onnxruntime's float32 run of the same model, and recorded.
    accuracy = result.job.accuracy
    assert accuracy is not None and accuracy.reference == "onnxruntime (float32)"
    assert accuracy.tolerance == RELATIVE_TOLERANCE["bf16"]
    (out,) = accuracy.outputs
    assert out.relative_error is not None and 0 < out.relative_error <= accuracy.tolerance
    assert out.cosine > 0.999
    assert all(c.ok and c.reference == "onnxruntime (float32)" for c in result.comparisons)
    shown = JobOut.of(
        result.job, {"trials_done": 0, "trials_total": 0, "tasks_done": 0, "tasks_total": 0}, "m"
    )
    assert shown.precision == "bf16" and shown.accuracy is not None and shown.accuracy.tolerance is not None

    manifest = _manifest(result)
    assert manifest["precision"]["policy"] == "bf16"
    assert manifest["precision"]["reduced_ops"] == result.fusion.reduced_ops
    # 4 rows are no AMX block; with AVX512-BF16, 256 x 512 packs for vdpbf16ps and 512 x 10 does not.
    if has_avx512_bf16(to_tvm_target(host_target())):
        assert result.fusion.avx512_bf16_matmuls == ["matmul 4x256 @ 256x512"]
        assert manifest["precision"]["compute"] == "mixed"
        fc1 = next(t for t in result.tasks if "dpbf16_matmul" in t.name)
        assert "kiln_dpbf16ps_16x2" in best_schedule(sqlite_store, result.job, fc1).tir
    else:
        assert manifest["precision"]["compute"] == "emulated"
    assert manifest["precision"]["avx512_bf16_matmuls"] == result.fusion.avx512_bf16_matmuls
    assert manifest["precision"]["accuracy"] == accuracy.to_dict()
    assert manifest["quantization"]["accuracy"] is None
    assert manifest["verification"]["tolerance"] == {"norm_wise_relative": accuracy.tolerance}

    x = np.random.default_rng(7).standard_normal((4, 256)).astype(np.float32)
    _assert_artifact_within_reduced_tolerance(result, path, x, tmp_path)


@pytest.mark.skipif(
    not has_amx_bf16(to_tvm_target(host_target())),
    reason="this CPU has no AMX-BF16 (tests/unit/test_amx.py builds the bf16 AMX kernels for one)",
)
def test_a_bf16_job_on_an_amx_cpu_computes_the_matmuls_that_fit_natively(
    sqlite_store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "mlp32.onnx"
    result = _tuned_reduced_job(sqlite_store, tmp_path, build_mlp(batch=32), path, trials=8)
    # 32 x 256 @ 256 x 512 is whole 16 x 32 x 32 blocks; 512 x 10 is not (10 columns): "mixed".
    assert result.fusion.amx_bf16_matmuls == ["matmul 32x256 @ 256x512"]
    assert result.fusion.precision_compute == "mixed"
    assert result.fusion.precision_note.startswith("1 of 2 on AMX-BF16 tiles (tdpbf16ps")
    fc1 = next(t for t in result.tasks if "amx_bf16_matmul" in t.name)
    tuned = best_schedule(sqlite_store, result.job, fc1).tir
    assert "llvm.x86.tdpbf16ps" in tuned, tuned
    (out,) = result.job.accuracy.outputs  # type: ignore[union-attr]
    assert out.relative_error is not None and 0 < out.relative_error <= RELATIVE_TOLERANCE["bf16"]

    manifest = _manifest(result)
    assert manifest["precision"]["compute"] == "mixed"
    assert manifest["precision"]["amx_bf16_matmuls"] == result.fusion.amx_bf16_matmuls
    # Plain TVM in a fresh process (which never asked Linux for AMX state: the library asks on load).
    x = np.random.default_rng(8).standard_normal((32, 256)).astype(np.float32)
    _assert_artifact_within_reduced_tolerance(result, path, x, tmp_path)


@pytest.mark.skipif(
    not has_avx512_bf16(to_tvm_target(host_target())),
    reason="this CPU has no AVX512-BF16 (tests/unit/test_avx512_bf16.py builds the kernels for one)",
)
def test_a_bf16_cnn_job_on_an_avx512_bf16_cpu_computes_its_convolutions_on_vdpbf16ps(
    sqlite_store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "cnn.onnx"
    result = _tuned_reduced_job(sqlite_store, tmp_path, build_small_cnn(image_size=16), path, trials=8)
    # The three convolutions (the RGB stem filled to 4 channels) on vdpbf16ps; the 10-class matmul not.
    assert len(result.fusion.avx512_bf16_convolutions) == 3
    assert result.fusion.precision_compute == "mixed"
    (unpacked,) = result.fusion.bf16_unpacked
    assert unpacked.startswith("matmul 1x32 @ 32x10:")
    conv = max((t for t in result.tasks if "dpbf16_conv2d" in t.name), key=lambda t: t.flops)
    assert "kiln_dpbf16ps_16x2" in best_schedule(sqlite_store, result.job, conv).tir
    # As the service shows it, in a process that has registered no intrinsic before reading the trace.
    shown = subprocess.run(
        [sys.executable, "-c", SHOW_BEST, str(tmp_path), result.job.id, str(conv.id)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0 and "kiln_dpbf16ps_16x2" in shown.stdout, shown.stderr[-2000:]
    (out,) = result.job.accuracy.outputs  # type: ignore[union-attr]
    assert out.relative_error is not None and 0 < out.relative_error <= RELATIVE_TOLERANCE["bf16"]

    manifest = _manifest(result)
    assert manifest["precision"]["avx512_bf16_convolutions"] == result.fusion.avx512_bf16_convolutions
    assert manifest["precision"]["bf16_unpacked"] == [unpacked]
    x = np.random.default_rng(9).standard_normal((1, 3, 16, 16)).astype(np.float32)
    _assert_artifact_within_reduced_tolerance(result, path, x, tmp_path)


@pytest.mark.skipif(
    not has_amx_bf16(to_tvm_target(host_target())),
    reason="this CPU has no AMX-BF16 (tests/unit/test_amx_convolutions.py builds the convolutions' tile "
    "kernels for one, and runs their layout on vdpbf16ps where it can)",
)
def test_a_bf16_cnn_job_on_an_amx_cpu_computes_its_convolutions_on_tiles(
    sqlite_store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "bottleneck.onnx"
    result = _tuned_reduced_job(sqlite_store, tmp_path, build_bottleneck(), path, trials=8)
    assert result.fusion.amx_bf16_matmuls == [
        "conv2d 1x16x16x64 * 64x1x1x64 as matmul 256x64 @ 64x64",
        "conv2d 1x16x16x64 * 64x3x3x64 as implicit GEMM 352x576 @ 576x64",
        "conv2d 1x16x16x64 * 32x1x1x64 as matmul 64x64 @ 64x32",
    ]
    assert result.fusion.precision_compute == "native"
    on_tiles = [t for t in result.tasks if "amx_bf16_matmul" in t.name]
    assert len(on_tiles) == 3, [t.name for t in result.tasks]
    for task in on_tiles:
        assert "llvm.x86.tdpbf16ps" in best_schedule(sqlite_store, result.job, task).tir, task.name
    (out,) = result.job.accuracy.outputs  # type: ignore[union-attr]
    assert out.relative_error is not None and 0 < out.relative_error <= RELATIVE_TOLERANCE["bf16"]
    x = np.random.default_rng(10).standard_normal((1, 64, 16, 16)).astype(np.float32)
    _assert_artifact_within_reduced_tolerance(result, path, x, tmp_path)


def test_a_bf16_attention_job_puts_its_scores_and_weighted_sum_on_amx_tiles_or_says_why_not(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """Q @ K^T and P @ V (no constant operand): on an AMX CPU packed as the model runs and tuned on
    tdpbf16ps; elsewhere widened, the plan saying why; within the bf16 tolerance either way."""
    path = tmp_path / "attention.onnx"
    result = _tuned_reduced_job(sqlite_store, tmp_path, build_attention_scores(), path, trials=8)
    attention = ["matmul 1x64x32 @ 1x32x64", "matmul 1x64x64 @ 1x64x32"]
    if has_amx_bf16(to_tvm_target(host_target())):
        assert [m for m in result.fusion.amx_bf16_matmuls if "packed as it runs" in m] == [
            f"{m} (packed as it runs)" for m in attention
        ]
        for task in [t for t in result.tasks if "amx_bf16_matmul" in t.name]:
            assert "llvm.x86.tdpbf16ps" in best_schedule(sqlite_store, result.job, task).tir, task.name
    elif has_avx512_bf16(to_tvm_target(host_target())):
        widened = [why for why in result.fusion.bf16_unpacked if "two computed operands" in why]
        assert [why.split(":")[0] for why in widened] == attention, result.fusion.bf16_unpacked
        assert not any("packed as it runs" in m for m in result.fusion.avx512_bf16_matmuls)
    else:  # no bf16 instruction at all: every bf16 operator widened, nothing packed
        assert result.fusion.precision_compute == "emulated" and not result.fusion.bf16_unpacked
    (out,) = result.job.accuracy.outputs  # type: ignore[union-attr]
    assert out.relative_error is not None and 0 < out.relative_error <= RELATIVE_TOLERANCE["bf16"]
    x = np.random.default_rng(13).standard_normal((1, 64, 32)).astype(np.float32)
    _assert_artifact_within_reduced_tolerance(result, path, x, tmp_path)


def test_an_fp16_job_computes_its_matmuls_on_fp16_operands_and_is_verified(
    sqlite_store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "mlp.onnx"
    result = _tuned_reduced_job(sqlite_store, tmp_path, build_mlp(batch=4), path, trials=6, precision="fp16")
    assert result.job.spec.precision == "fp16"
    assert result.fusion.reduced_ops == ["matmul 4x256 @ 256x512 -> fp16", "matmul 4x512 @ 512x10 -> fp16"]
    matmul = max(result.tasks, key=lambda t: t.flops)
    assert '"float16"' in best_schedule(sqlite_store, result.job, matmul).tir
    accuracy = result.job.accuracy
    assert accuracy is not None and accuracy.tolerance == RELATIVE_TOLERANCE["fp16"]
    (out,) = accuracy.outputs
    assert out.relative_error is not None and 0 < out.relative_error <= accuracy.tolerance
    manifest = _manifest(result)
    assert manifest["precision"]["policy"] == "fp16"
    assert manifest["precision"]["compute"] == "emulated"  # no CPU here computes fp16 products natively
    x = np.random.default_rng(10).standard_normal((4, 256)).astype(np.float32)
    _assert_artifact_within_reduced_tolerance(result, path, x, tmp_path, precision="fp16")


@pytest.mark.skipif(not HOST_BF16, reason=NO_HOST_BF16)
def test_an_auto_job_on_a_cpu_with_bf16_instructions_computes_in_bf16_and_says_why(
    sqlite_store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "mlp.onnx"
    result = _tuned_reduced_job(sqlite_store, tmp_path, build_mlp(batch=4), path, trials=6, precision="auto")
    assert result.job.spec.precision == "auto"
    fusion = result.fusion
    assert fusion.precision == "bf16"
    assert fusion.reduced_ops == ["matmul 4x256 @ 256x512 -> bf16", "matmul 4x512 @ 512x10 -> bf16"]
    assert (
        fusion.precision_choice == f"auto: bf16, which this CPU multiplies natively ({', '.join(HOST_BF16)})"
    )
    accuracy = result.job.accuracy
    assert accuracy is not None and accuracy.tolerance == RELATIVE_TOLERANCE["bf16"]
    (out,) = accuracy.outputs
    assert out.relative_error is not None and 0 < out.relative_error <= accuracy.tolerance
    manifest = _manifest(result)["precision"]
    assert (manifest["policy"], manifest["computed_in"]) == ("auto", "bf16")
    assert manifest["choice"] == fusion.precision_choice
    x = np.random.default_rng(11).standard_normal((4, 256)).astype(np.float32)
    _assert_artifact_within_reduced_tolerance(result, path, x, tmp_path)


@pytest.mark.skipif(not HOST_BF16, reason=NO_HOST_BF16)
def test_an_auto_job_stays_as_is_when_bf16_would_take_its_outputs_beyond_the_tolerance(
    sqlite_store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "cancelling.onnx"
    result = _tuned_reduced_job(
        sqlite_store, tmp_path, build_cancelling_matmuls(), path, trials=4, precision="auto"
    )
    fusion = result.fusion
    assert fusion.precision == "as-is" and fusion.reduced_ops == [] and fusion.precision_compute == ""
    choice = fusion.precision_choice
    assert choice.startswith("auto: as-is, since bf16 took output y a relative ") and choice.endswith(
        f"from onnxruntime (float32), beyond the bf16 tolerance of {RELATIVE_TOLERANCE['bf16']:.3g}"
    )
    # The error the choice reports is the model's, not a wrong kernel's: bf16 operands give it too.
    said = float(choice.split("a relative ")[1].split(" ")[0])
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    want = onnxruntime_output(path, x)
    rounded = rounded_operands_output(path, x)
    assert said > RELATIVE_TOLERANCE["bf16"]
    assert np.linalg.norm(rounded - want) / np.linalg.norm(want) > RELATIVE_TOLERANCE["bf16"]
    # Planned and verified as float32: element-wise against onnxruntime, and so is the artifact.
    assert result.comparisons and all(c.ok for c in result.comparisons)
    assert result.job.accuracy is None
    got = run_artifact_in_fresh_process(Path(result.artifact.path), x, tmp_path)  # type: ignore[union-attr]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    manifest = _manifest(result)["precision"]
    assert (manifest["policy"], manifest["computed_in"], manifest["choice"]) == ("auto", "as-is", choice)
    # A preview of the job's plan (the API's /graph and /tasks) chooses alike, in the sandbox.
    settings = Settings(data_dir=tmp_path, database_url=None)
    model = sqlite_store.get_model(result.job.spec.model_id)
    with ModelSandbox(settings, warm_processes=0) as sandbox:
        previewed = plan_model(sqlite_store, settings, sandbox, model, "host", precision="auto")
    assert previewed.fusion.precision_choice == choice and previewed.fusion.reduced_ops == []
