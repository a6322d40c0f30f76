"""A quantized (QDQ) model end to end: tuned in integers, verified to within a step of onnxruntime, packaged
with what was lowered, and loadable by plain TVM."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from schedules.amx import has_amx_int8
from schedules.vnni import integer_dot, seven_bit_dot
from service.schemas import JobOut
from tests.artifacts import onnxruntime_output, read_records_in_fresh_process, run_artifact_in_fresh_process
from tests.cost_model_catch_up import catch_up_in_fresh_process
from tests.host_jobs import run_host_job
from tests.model_builders import build_bottleneck, build_encoder_block, build_mlp
from tests.quant_models import (
    QuantSpec,
    build_qdq_net,
    output_step,
    quantized_by_onnxruntime,
    reference_output,
)
from tuner.compile import LoadedModel, build_untuned
from tuner.entities import JobSpec, JobStatus
from tuner.errors import InvalidSpec
from tuner.frontend import load_model
from tuner.jobs.pipeline import run_job
from tuner.jobs.submission import submit_job
from tuner.model_registry import register_model
from tuner.passes.plan import plan_graph
from tuner.settings import Settings
from tuner.store import Store
from tuner.targets import host_target, to_tvm_target
from tuner.timing.verify import REFERENCE_SEMANTICS
from tuner.views.inspection import best_schedule

pytestmark = pytest.mark.slow


def test_a_qdq_cnn_tunes_in_integers_and_matches_onnxruntime(sqlite_store: Store, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=None, poly_seeds=2)
    model_proto = build_qdq_net("conv", QuantSpec(activation="relu"))
    path = tmp_path / "cnn_int8.onnx"
    onnx.save(model_proto, path)
    result = run_host_job(sqlite_store, settings, path, trials=8)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    assert all(c.ok for c in result.comparisons), result.comparisons
    assert result.fusion.integer_ops == [
        "conv2d 1x8x12x12 * 16x8x3x3 -> int8",
        "matmul 1x2304 @ 2304x10 -> int8",
    ]

    # The tuned convolution reads u8 activations and accumulates in int32: on a VNNI CPU with s8 weights
    # packed 16 x 4 and vpdpbusd; on an AVX2 CPU without VNNI with the weights packed 8 x 2 as int16 and
    # vpmaddwd; elsewhere in plain tiled loops.
    conv = next(t for t in result.tasks if "conv2d" in t.name)
    tuned = best_schedule(sqlite_store, result.job, conv).tir
    params = re.search(r"def main\((.*)\):", tuned).group(1)  # type: ignore[union-attr]
    assert re.match(r'\w+: T\.Buffer\(\(.*?\), "uint8"\)', params), params  # the activations
    dot = integer_dot(to_tvm_target(host_target()))
    if dot is not None:
        lanes, depth = dot.lanes, dot.depth
        assert result.fusion.integer_kernels == dot.kind
        assert [p.split(" ")[0] for p in result.fusion.vnni_packed] == ["conv2d"]
        assert result.fusion.vnni_unpacked == [
            f"matmul 1x2304 @ 2304x10: 10 output columns (a multiple of {lanes} is packed)"
        ]
        assert "vnni_conv2d" in conv.name and dot.llvm_intrinsic in tuned, tuned
        # The weight packed [O/L, KH, KW, C/D, L, D], and the requantization fused into the kernel.
        plain = re.sub(r"T\.int64\((\d+)\)", r"\1", params)
        shape = f"{16 // lanes}, 3, 3, {8 // depth}, {lanes}, {depth}"
        packed = rf'param_0: T\.Buffer\(\({shape}\), "{dot.weight_dtype}"\)'
        assert re.search(packed, plain), plain
        assert re.search(r'T\.Buffer\(\(1, 12, 12, 16\), "int8"\)$', plain), plain
    else:
        assert result.fusion.integer_kernels == "plain" and result.fusion.vnni_packed == []
        assert re.search(r'conv2d_nhwc_intermediate = T\.sblock_alloc_buffer\(\(.*\), "int32"\)', tuned), (
            tuned
        )
        assert re.search(r'param_0: T\.Buffer\(\(.*?\), "int8"\)', params), params

    with tarfile.open(result.artifact.path, "r:gz") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    assert manifest["quantization"]["integer_ops"] == result.fusion.integer_ops
    assert manifest["quantization"]["kept_float"] == []
    assert manifest["quantization"]["integer_kernels"] == result.fusion.integer_kernels
    # The accuracy report: the tuned outputs within a step of onnxruntime's over seeded inputs, kept in the
    # job (the API's job view) and in the manifest.
    accuracy = result.job.accuracy
    assert accuracy is not None and accuracy.reference == REFERENCE_SEMANTICS and accuracy.inputs == 8
    assert {c.reference for c in result.comparisons} == {"untuned TVM", REFERENCE_SEMANTICS}
    (out,) = accuracy.outputs
    assert out.step == pytest.approx(output_step(model_proto)) and out.max_steps is not None
    assert out.max_steps <= 1.001 and out.cosine > 0.999
    assert manifest["quantization"]["accuracy"] == accuracy.to_dict()
    assert sqlite_store.get_job(result.job.id).accuracy == accuracy
    shown = JobOut.of(
        result.job, {"trials_done": 0, "trials_total": 0, "tasks_done": 0, "tasks_total": 0}, "m"
    )
    assert shown.accuracy is not None and shown.accuracy.outputs[0].max_steps == out.max_steps
    assert manifest["quantization"]["vnni_packed"] == result.fusion.vnni_packed

    step = output_step(model_proto)
    x = np.random.default_rng(5).standard_normal((1, 8, 12, 12)).astype(np.float32)
    got = run_artifact_in_fresh_process(Path(result.artifact.path), x, tmp_path)
    expected = reference_output(path, x)
    assert np.abs(got - expected).max() <= 1.001 * step
    # onnxruntime as users run it, where it is itself within a step of the reference: on a CPU without
    # VNNI its u8 x s8 kernels saturate (4 steps off on this convolution on a Zen 3).
    ort = onnxruntime_output(path, x)
    if np.abs(ort - expected).max() <= 1.001 * step:
        assert np.abs(got - ort).max() <= 1.001 * step

    # Plain TVM reads the artifact's records in a process that never imported Kiln: on an x86 CPU with an
    # integer dot product after importing only the kiln_intrinsics package the artifact ships (without it,
    # the tensorized records cannot be replayed); elsewhere the records use no intrinsic of Kiln's and the
    # artifact ships none.
    artifact = Path(result.artifact.path)
    read = read_records_in_fresh_process(artifact, tmp_path, register=dot is not None)
    assert read.returncode == 0, read.stderr
    records = json.loads(read.stdout)
    assert records["records"] > 0 and records["kiln_modules"] == []
    if dot is not None:
        intrinsic = dot.intrinsic
        assert manifest["tensor_intrinsics"] == [intrinsic] and "kiln_intrinsics/" in manifest["files"]
        assert any(intrinsic in trace for trace in records["traces"])
        unregistered = read_records_in_fresh_process(artifact, tmp_path, register=False)
        assert unregistered.returncode != 0 and f"{intrinsic}" in unregistered.stderr
        # A job's cost model learns these records too, tensorized ones included, before it tunes.
        key = result.job.target_key
        stored = sqlite_store.records_since(key, 0)
        assert any(intrinsic in r.record_json for r in stored)
        caught_up = catch_up_in_fresh_process(settings.resolved_database_url, key)
        assert caught_up == {"learnt": len(stored), "last": stored[-1].id, "gpu_intrinsics_loaded": False}
    else:
        assert manifest["tensor_intrinsics"] == [] and "kiln_intrinsics/" not in manifest["files"]


def _quantized_mlp(workdir: Path, batch: int) -> tuple[Path, Path]:
    """:func:`build_mlp` and its QDQ twin from onnxruntime's ``quantize_static`` (per-channel weights)."""
    return quantized_by_onnxruntime(build_mlp(batch=batch), (batch, 256), workdir, "mlp")


@pytest.mark.skipif(
    not has_amx_int8(to_tvm_target(host_target())),
    reason="this CPU has no AMX-INT8 (tests/unit/test_amx.py builds the AMX kernels for one)",
)
def test_an_int8_mlp_tunes_on_amx_tiles_and_plain_tvm_runs_its_artifact(
    sqlite_store: Store, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path, database_url=None)
    _, int8 = _quantized_mlp(tmp_path, batch=32)
    result = run_host_job(sqlite_store, settings, int8, trials=8)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    assert all(c.ok for c in result.comparisons), result.comparisons
    # 32 x 256 @ 256 x 512 is whole 16 x 32 x 64 blocks; 512 x 10 is not packed at all (10 columns).
    assert result.fusion.integer_kernels == "amx"
    assert [m.split(" ")[1:4] for m in result.fusion.amx_matmuls] == [["32x256", "@", "256x512"]]
    fc1 = next(t for t in result.tasks if "vnni_matmul" in t.name)
    tuned = best_schedule(sqlite_store, result.job, fc1).tir
    assert "llvm.x86.tdpbusd" in tuned and "llvm.x86.ldtilecfg" in tuned, tuned
    (out,) = result.job.accuracy.outputs  # type: ignore[union-attr]
    assert out.max_steps is not None and out.max_steps <= 1.001

    # Plain TVM in a fresh process, which never asked Linux for AMX state: the library asks on load.
    x = np.random.default_rng(9).standard_normal((32, 256)).astype(np.float32)
    got = run_artifact_in_fresh_process(Path(result.artifact.path), x, tmp_path)
    model_proto = onnx.load(int8)
    assert np.abs(got - onnxruntime_output(int8, x)).max() <= 1.001 * output_step(model_proto)

    # Its records, tensorized on AMX tiles, read by plain TVM after importing the package it ships.
    read = read_records_in_fresh_process(Path(result.artifact.path), tmp_path, register=True)
    assert read.returncode == 0, read.stderr
    records = json.loads(read.stdout)
    assert records["kiln_modules"] == [] and any("kiln_amx_u8s8s32_" in t for t in records["traces"])


@pytest.mark.skipif(
    not has_amx_int8(to_tvm_target(host_target())),
    reason="this CPU has no AMX-INT8 (tests/unit/test_amx_convolutions.py plans this model for one, builds "
    "the tile kernels and runs their layout on vpdpbusd where it can)",
)
def test_a_quantized_cnn_tunes_its_convolutions_on_amx_tiles(sqlite_store: Store, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=None)
    _, int8 = quantized_by_onnxruntime(build_bottleneck(), (1, 64, 16, 16), tmp_path, "bottleneck")
    result = run_host_job(sqlite_store, settings, int8, trials=8)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    assert all(c.ok for c in result.comparisons), result.comparisons
    assert result.fusion.integer_kernels == "amx" and len(result.fusion.amx_matmuls) == 3
    on_tiles = [t for t in result.tasks if "vnni_matmul" in t.name]
    assert len(on_tiles) == 3, [t.name for t in result.tasks]
    for task in on_tiles:
        tuned = best_schedule(sqlite_store, result.job, task).tir
        assert "llvm.x86.tdpbusd" in tuned, task.name
    x = np.random.default_rng(11).standard_normal((1, 64, 16, 16)).astype(np.float32)
    got = run_artifact_in_fresh_process(Path(result.artifact.path), x, tmp_path)
    assert np.abs(got - reference_output(int8, x)).max() <= 1.001 * output_step(onnx.load(int8))


#: The QDQ encoder block's four weight matmuls (QKV, output projection, FFN up and down): on AMX-INT8 tiles.
ENCODER_AMX_MATMULS = [
    "matmul 1x32x64 @ 64x192",
    "matmul 1x32x64 @ 64x64",
    "matmul 1x32x64 @ 64x256",
    "matmul 1x32x256 @ 256x64",
]
ENCODER_SHAPE = (1, 32, 64)


@pytest.mark.slow
def test_an_int8_plan_for_an_amx_cpu_puts_a_quantized_encoders_matmuls_on_tiles(tmp_path: Path) -> None:
    """A BERT-style block as users quantize it, planned for an AMX CPU (this one, or Sapphire Rapids built
    here): its four weight matmuls on AMX-INT8 tiles, its GELU chain a table; the rewritten graph, built
    plainly for this CPU, computes ONNX's reference semantics to the step."""
    _, path = quantized_by_onnxruntime(build_encoder_block(), ENCODER_SHAPE, tmp_path, "encoder")
    host = to_tvm_target(host_target())
    amx = (
        host
        if has_amx_int8(host)
        else to_tvm_target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
    )
    plan = plan_graph(load_model(path).mod, amx)
    assert plan.fusion.integer_kernels == "amx"
    assert plan.fusion.amx_matmuls == ENCODER_AMX_MATMULS
    assert "erf chain 1x32x256 int8 -> int8: 13 operators as a 256-entry table" in plan.fusion.integer_ops
    assert sum("vnni_matmul" in task.task_name for task in plan.tasks) == 4
    x = np.random.default_rng(3).standard_normal(ENCODER_SHAPE).astype(np.float32)
    (got,) = LoadedModel(build_untuned(plan.prepared, host)).run([x])
    assert np.abs(got - reference_output(path, x)).max() <= 1.001 * output_step(onnx.load(path))


@pytest.mark.skipif(
    not has_amx_int8(to_tvm_target(host_target())),
    reason="this CPU has no AMX-INT8 (the test above plans the encoder for one and checks the rewritten graph)",
)
def test_a_quantized_encoder_job_runs_its_matmuls_on_amx_tiles(sqlite_store: Store, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=None)
    _, int8 = quantized_by_onnxruntime(build_encoder_block(), ENCODER_SHAPE, tmp_path, "encoder")
    result = run_host_job(sqlite_store, settings, int8, trials=32)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    assert all(c.ok for c in result.comparisons), result.comparisons
    assert result.fusion.integer_kernels == "amx" and result.fusion.amx_matmuls == ENCODER_AMX_MATMULS
    on_tiles = [t for t in result.tasks if "vnni_matmul" in t.name]
    assert len(on_tiles) == 4, [t.name for t in result.tasks]
    for task in on_tiles:  # as compiled into the model, tuned or not
        assert "tdpbusd" in sqlite_store.get_task_assembly(task.id).text, task.name
    x = np.random.default_rng(12).standard_normal(ENCODER_SHAPE).astype(np.float32)
    got = run_artifact_in_fresh_process(Path(result.artifact.path), x, tmp_path)
    assert np.abs(got - reference_output(int8, x)).max() <= 1.001 * output_step(onnx.load(int8))


def test_a_model_quantized_by_onnxruntime_reports_top1_agreement_with_its_float_model(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """The way users quantize (onnxruntime's quantize_static), with the float model given: the accuracy
    report adds, per output, the share of rows whose arg-max agrees with the float model's."""
    settings = Settings(data_dir=tmp_path, database_url=None)
    fp32, int8 = _quantized_mlp(tmp_path, batch=4)
    quantized, _ = register_model(sqlite_store, settings, int8)
    floats, _ = register_model(sqlite_store, settings, fp32)
    spec = JobSpec(model_id=quantized.id, target=host_target(), trials=4, float_model_id=floats.id)
    result = run_job(sqlite_store, settings, submit_job(sqlite_store, spec).id)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    assert result.fusion.integer_ops  # the products run in integers
    accuracy = result.job.accuracy
    assert accuracy is not None and accuracy.float_model == floats.name
    (out,) = accuracy.outputs
    # 8 inputs x 4 rows; int8 with per-channel weights keeps nearly every top-1 of a 2-layer MLP.
    assert out.top1_agreement is not None and out.top1_agreement >= 0.75, out
    assert out.max_steps is not None and out.max_steps <= 1.001
    assert sqlite_store.get_job(result.job.id).accuracy == accuracy


def test_a_float_model_with_other_inputs_is_refused(sqlite_store: Store, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=None)
    onnx.save(build_mlp(batch=4), tmp_path / "mlp4.onnx")
    onnx.save(build_mlp(batch=2), tmp_path / "mlp2.onnx")
    model, _ = register_model(sqlite_store, settings, tmp_path / "mlp4.onnx")
    other, _ = register_model(sqlite_store, settings, tmp_path / "mlp2.onnx")
    for float_id, why in ((other.id, "takes inputs"), (model.id, "names the model being tuned")):
        spec = JobSpec(model_id=model.id, target=host_target(), trials=4, float_model_id=float_id)
        with pytest.raises(InvalidSpec, match=why):
            submit_job(sqlite_store, spec)


def test_a_float_model_with_calibration_inputs_becomes_an_int8_artifact(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """precision int8 on a float CNN and an .npz of its inputs: quantized within the budget, every
    convolution and matmul tuned in integers (u8 activations, int32 accumulation; on this CPU's integer dot
    product where it has one), exact against the QDQ model's reference semantics, top-1 against the float
    model reported; a budget int8 breaks returns the worst operators to float32 and says so."""
    from tests.model_builders import build_small_cnn
    from tuner.entities import AccuracyBudget
    from tuner.quantization.calibration_files import save_calibration

    settings = Settings(data_dir=tmp_path, database_url=None, poly_seeds=2)
    path = tmp_path / "cnn.onnx"
    onnx.save(build_small_cnn(batch=2, image_size=16), path)
    samples = np.random.default_rng(4).standard_normal((24, 3, 16, 16)).astype(np.float32)  # 12 samples of 2
    calibration = tmp_path / "inputs.npz"
    np.savez(calibration, x=samples)
    stored = save_calibration(settings, calibration.read_bytes())

    result = run_host_job(sqlite_store, settings, path, trials=6, precision="int8", calibration_id=stored.id)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    q = result.job.accuracy.quantization if result.job.accuracy else None
    assert q is not None and q.within_budget and not q.synthetic and q.returned == ()
    assert q.samples == "6 calibration and 6 validation samples from the user's calibration file"
    assert set(q.precision) == {"conv1", "conv2", "conv3", "fc"} and set(q.precision.values()) == {"int8"}
    assert len(result.fusion.integer_ops) == 4 and result.fusion.kept_float == []
    # The accuracy report: the tuned build within a step of the quantized model's reference semantics
    # (the budget held with the cores' outputs rounded to 8 bits, the faster form), and its top-1 against
    # the float model it came from.
    assert not q.float_outputs
    (out,) = result.job.accuracy.outputs
    assert out.max_steps is not None and out.max_steps <= 1.001 and out.top1_agreement is not None
    assert result.job.accuracy.float_model == "cnn (float32)"
    # The convolutions' compiled kernels multiply u8 activations into int32 sums: on this CPU's integer dot
    # product where it has one (every convolution packed for it, the RGB one with a zero channel).
    dot = integer_dot(to_tvm_target(host_target()))
    convs = [t for t in result.tasks if "conv2d" in t.name]
    assert len(convs) == 3
    # Without VNNI, Kiln quantized the weights to 7 bits, so that every kernel takes vpmaddubsw (exact on them).
    seven = seven_bit_dot(to_tvm_target(host_target()))
    assert q.weight_bits == (7 if seven is not None else 8)
    if dot is not None:
        assert [p.split(" ")[0] for p in result.fusion.vnni_packed] == ["conv2d"] * 3
        assert result.fusion.seven_bit_packed == (result.fusion.vnni_packed if seven is not None else [])
        instruction = (seven or dot).instruction.split(" ")[0]  # vpdpbusd, vpmaddubsw
        for conv in convs:
            assembly = sqlite_store.get_task_assembly(conv.id).text
            assert instruction in assembly, (conv.name, instruction)
    with tarfile.open(result.artifact.path, "r:gz") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    assert manifest["quantization"]["from_float"] == q.to_dict()
    assert q.speeds == () and q.speed_note == "not timed: precision int8 was asked for by name"
    assert manifest["precision"]["policy"] == "int8"

    # A budget no int8 operator holds (the bottleneck's output is not a classifier: judged by its
    # relative error): every operator returns to float32, and the job says so.
    bottleneck = tmp_path / "bottleneck.onnx"
    onnx.save(build_bottleneck(), bottleneck)
    strict = run_host_job(
        sqlite_store,
        settings,
        bottleneck,
        trials=0,
        precision="int8",
        accuracy_budget=AccuracyBudget(max_relative_error=1e-6),
    )
    assert strict.job.status is JobStatus.SUCCEEDED, strict.job.error
    s = strict.job.accuracy.quantization if strict.job.accuracy else None
    assert s is not None and s.synthetic and s.before.relative_error["y"] > 1e-6
    # Before any return, the outputs were left in float (the budget broke with them rounded).
    assert s.float_outputs
    assert len(s.returned) == 3 and set(s.precision.values()) == {"float32"}
    assert s.within_budget and s.after.relative_error["y"] == 0.0
    assert strict.fusion.integer_ops == []


def test_a_torch_export_program_with_calibration_inputs_becomes_an_int8_artifact(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """A .pt2 program is exported to ONNX by torch's exporter and quantized like an ONNX model: its
    convolutions computed in integers, the calibration file's arrays named after the program's inputs, the
    accuracy report against the program itself."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch's ONNX exporter needs onnxscript (Kiln's torch extra)")
    from tests.model_builders import build_torch_relu6_cnn, save_torch_program
    from tuner.quantization.calibration_files import save_calibration

    settings = Settings(data_dir=tmp_path, database_url=None, poly_seeds=2)
    program = save_torch_program(build_torch_relu6_cnn(), (torch.randn(1, 3, 12, 12),), tmp_path / "cnn.pt2")
    calibration = tmp_path / "inputs.npz"
    # nn.Sequential names its input "input": the program's user input, and the array's name.
    np.savez(calibration, input=np.random.default_rng(5).standard_normal((16, 3, 12, 12)).astype(np.float32))
    stored = save_calibration(settings, calibration.read_bytes())

    result = run_host_job(
        sqlite_store, settings, program, trials=4, precision="int8", calibration_id=stored.id
    )
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    q = result.job.accuracy.quantization if result.job.accuracy else None
    assert q is not None and not q.synthetic and q.within_budget
    assert q.samples == "8 calibration and 8 validation samples from the user's calibration file"
    assert len(q.precision) == 3 and q.before.relative_error, q
    ints = [p for p, v in q.precision.items() if v == "int8"]
    conv_ops = [op for op in result.fusion.integer_ops if op.startswith("conv2d")]
    assert len(conv_ops) == len(ints) >= 1, (result.fusion.integer_ops, q.precision)
    assert result.job.accuracy.float_model == "cnn (float32)"
    (out,) = result.job.accuracy.outputs
    assert out.relative_error is not None and out.relative_error < 1e-5, out


def test_a_jax_program_is_refused_for_int8_with_the_reason() -> None:
    from datetime import datetime, timezone

    from tuner.entities import ModelFormat, ModelInfo, ModelSignature
    from tuner.quantization.calibration_files import check_int8_model

    signature = ModelSignature(inputs=(), outputs=())
    for fmt in (ModelFormat.JAX_EXPORT, ModelFormat.STABLEHLO):
        model = ModelInfo("m", "f", fmt, "0" * 64, 1, signature, datetime.now(timezone.utc))
        with pytest.raises(InvalidSpec, match="converters trace Python functions"):
            check_int8_model(model)


def test_for_a_bf16_cpu_a_budget_int8_breaks_returns_operators_to_bf16_kernels(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """For a Sapphire Rapids (AMX-BF16, AVX512-BF16; planned here, build-only): the operator the budget
    returns from int8 goes to bf16, its operands rounded so in the QDQ model the accuracy control judged, and
    Kiln plans it on that CPU's bf16 instructions, the other two on integer kernels. Planned for this CPU,
    the same graph computes what onnxruntime computes from that model as written."""
    from tuner.entities import AccuracyBudget
    from tuner.jobs.quantizing import quantize_model

    settings = Settings(data_dir=tmp_path, database_url=None, poly_seeds=2)
    bottleneck = tmp_path / "bottleneck.onnx"
    onnx.save(build_bottleneck(), bottleneck)
    model, _ = register_model(sqlite_store, settings, bottleneck)
    spec = JobSpec(
        model_id=model.id,
        target={"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2},
        trials=0,
        precision="int8",
        # Between the error of the worst operator returned in bf16 and that of all of them in int8
        # (0.0137 and 0.0183 with minmax calibration on the bottleneck's synthetic samples).
        accuracy_budget=AccuracyBudget(max_relative_error=0.016),
    )
    path, q = quantize_model(settings, spec, model, bottleneck, shapes={}, workdir=tmp_path / "q")
    assert q.within_budget and q.returned_precision == "bf16", q
    assert q.weight_bits == 8  # Sapphire Rapids has VNNI
    assert sorted(q.precision.values()) == ["bf16", "int8", "int8"]

    fusion = plan_graph(load_model(path).mod, to_tvm_target(spec.target)).fusion
    assert len(fusion.integer_ops) == 2
    (reduced,) = fusion.reduced_ops
    assert reduced.startswith("conv2d") and reduced.endswith("-> bf16 (rounded so by the model)")
    assert len([*fusion.amx_bf16_matmuls, *fusion.avx512_bf16_convolutions]) == 1, fusion.bf16_unpacked

    host = to_tvm_target(host_target())
    plan = plan_graph(load_model(path).mod, host)
    x = np.random.default_rng(6).standard_normal((1, 64, 16, 16)).astype(np.float32)
    (got,) = LoadedModel(build_untuned(plan.prepared, host)).run([x])
    expected = reference_output(path, x)
    # Exact but for float32 summation order (1.3e-7 measured): the bf16 rounding and the integer sums alike.
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-5


def test_auto_keeps_int8_only_where_an_operator_timed_alone_is_faster_in_it(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """precision auto with calibration inputs: each int8 operator is cut out of the model and timed alone
    in int8 and in float32 (this CPU has no native bf16) on this CPU; those no faster in int8 return to
    float32 while the budget holds, and the job's kernels follow that map."""
    from tests.model_builders import build_small_cnn
    from tuner.quantization.calibration_files import save_calibration

    settings = Settings(data_dir=tmp_path, database_url=None, poly_seeds=2)
    path = tmp_path / "cnn.onnx"
    onnx.save(build_small_cnn(batch=2, image_size=16), path)
    calibration = tmp_path / "inputs.npz"
    np.savez(calibration, x=np.random.default_rng(4).standard_normal((24, 3, 16, 16)).astype(np.float32))
    stored = save_calibration(settings, calibration.read_bytes())

    result = run_host_job(sqlite_store, settings, path, trials=4, precision="auto", calibration_id=stored.id)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    q = result.job.accuracy.quantization if result.job.accuracy else None
    assert q is not None and q.within_budget and q.returned == ()
    assert [s.name for s in q.speeds] == ["conv1", "conv2", "conv3", "fc"] and q.speed_note == ""
    assert all(s.int8_ms > 0 and s.other_ms > 0 and s.other == "float32" for s in q.speeds)
    slower = {s.name for s in q.speeds if s.chosen != "int8"}
    assert {name.split(" ")[0] for name in q.returned_for_speed} == slower
    assert {n for n, p in q.precision.items() if p == "float32"} == slower
    assert q.returned_precision == "float32"
    # The kernels follow the map: one integer core per operator kept in int8.
    cores = [op for op in result.fusion.integer_ops if op.startswith(("conv2d", "matmul"))]
    assert len(cores) == 4 - len(slower), (result.fusion.integer_ops, q.precision)
    assert "no faster in int8 (timed alone)" in result.fusion.precision_choice
