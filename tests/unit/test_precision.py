"""Precision policies: matmuls and convolutions on bf16/fp16 operands with fp32 accumulation, the rest in
fp32, weights folded to the low precision, the error of the low precision and no more."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from kiln_tvm import relax, tvm
from tests.artifacts import onnxruntime_output
from tests.model_builders import build_mlp, build_small_cnn
from tuner.compile import LoadedModel, build_untuned
from tuner.entities import JobSpec, PlanningOptions
from tuner.errors import InvalidSpec, VerificationFailed
from tuner.frontend import load_model
from tuner.jobs.target_check import validate_spec
from tuner.passes.plan import plan_graph
from tuner.passes.precision import RELATIVE_TOLERANCE, native_bf16, precision_compute
from tuner.targets import host_target, to_tvm_target
from tuner.timing.accuracy import accuracy_report, require_accuracy

TARGET = to_tvm_target(host_target())
#: CPUs without and with AVX512-BF16 (planned for, not run on).
AVX2_TARGET = to_tvm_target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})
ZEN4_TARGET = to_tvm_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
LOW = {"bf16": "bfloat16", "fp16": "float16"}


def _calls(mod: tvm.IRModule, name: str) -> list[relax.Call]:
    found: list[relax.Call] = []

    def visit(expr: object) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == name:
            found.append(expr)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return found


def _constant_dtypes(mod: tvm.IRModule) -> set[str]:
    found: set[str] = set()

    def visit(expr: object) -> None:
        # A Relax constant holds its tensor in .value (shape constants in types hold an int).
        if isinstance(expr, tvm.ir.expr.Constant) and hasattr(expr.value, "dtype"):
            found.add(str(expr.value.dtype))

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return found


def _relative_error(model: onnx.ModelProto, policy: str, tmp_path: Path, shape: tuple[int, ...]) -> float:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    plan = plan_graph(load_model(path).mod, TARGET, PlanningOptions(precision=policy))
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    (got,) = LoadedModel(build_untuned(plan.prepared, TARGET)).run([x])
    want = onnxruntime_output(path, x)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("policy", ["bf16", "fp16"])
def test_a_policy_puts_convolutions_and_matmuls_on_low_precision_operands(
    tmp_path: Path, policy: str
) -> None:
    path = tmp_path / "cnn.onnx"
    onnx.save(build_small_cnn(), path)
    # A CPU with no bf16 instruction: the cores stay the operators they were, on cast operands.
    plan = plan_graph(load_model(path).mod, AVX2_TARGET, PlanningOptions(precision=policy))
    assert plan.fusion.precision == policy
    assert [op.split(" ")[0] for op in plan.fusion.reduced_ops] == ["conv2d"] * 3 + ["matmul"]
    assert all(op.endswith(f"-> {policy}") for op in plan.fusion.reduced_ops)
    cores = _calls(plan.prepared, "relax.nn.conv2d") + _calls(plan.prepared, "relax.matmul")
    assert len(cores) == 4
    for call in cores:
        # Both operands in the low precision, accumulated and returned in fp32.
        assert [str(a.ty.dtype) for a in call.args[:2]] == [LOW[policy]] * 2
        assert str(call.ty.dtype) == "float32"
    # The weights were folded to low-precision constants (half the bytes); the biases stay fp32.
    assert LOW[policy] in _constant_dtypes(plan.prepared)
    # What the CPU does with it is said, with why: emulated in fp32.
    assert plan.fusion.precision_compute == "emulated" and plan.fusion.precision_note
    assert plan.fusion.avx512_bf16_convolutions == [] and plan.fusion.bf16_unpacked == []


def test_on_avx512_bf16_the_convolutions_go_on_vdpbf16ps_and_the_rest_says_why(tmp_path: Path) -> None:
    path = tmp_path / "cnn.onnx"
    onnx.save(build_small_cnn(), path)
    plan = plan_graph(load_model(path).mod, ZEN4_TARGET, PlanningOptions(precision="bf16"))
    # All three convolutions: 16 and 32 output channels; the RGB stem's 3 channels filled to 4.
    assert plan.fusion.avx512_bf16_convolutions == [
        "conv2d 1x32x32x3 * 16x3x3x3",
        "conv2d 1x32x32x16 * 32x3x3x16",
        "conv2d 1x16x16x32 * 32x3x3x32",
    ]
    assert not _calls(plan.prepared, "relax.nn.conv2d")
    assert plan.fusion.bf16_unpacked == [
        "matmul 1x32 @ 32x10: 10 columns, 32 deep (vdpbf16ps: multiples of 16, 2)"
    ]
    assert plan.fusion.precision_compute == "mixed"
    assert plan.fusion.precision_note.startswith("3 of 4 on AVX512-BF16 (vdpbf16ps")
    assert sum("dpbf16_conv2d" in t.name for t in plan.infos) == 3


@pytest.mark.parametrize(("policy", "model", "shape"), [
    ("bf16", build_small_cnn(), (1, 3, 32, 32)),
    ("fp16", build_small_cnn(), (1, 3, 32, 32)),
    ("bf16", build_mlp(batch=4), (4, 256)),
])  # fmt: skip
def test_a_reduced_model_carries_the_low_precisions_error_and_no_more(
    tmp_path: Path, policy: str, model: onnx.ModelProto, shape: tuple[int, ...]
) -> None:
    error = _relative_error(model, policy, tmp_path, shape)
    # The operands were really rounded (fp32 throughout would be ~1e-7 off), within the policy's tolerance.
    assert 1e-5 < error <= RELATIVE_TOLERANCE[policy] / 4, error


def test_as_is_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "cnn.onnx"
    onnx.save(build_small_cnn(), path)
    plan = plan_graph(load_model(path).mod, TARGET)
    assert plan.fusion.precision == "as-is" and plan.fusion.reduced_ops == []
    assert plan.fusion.precision_compute == ""
    assert not _calls(plan.prepared, "relax.astype")
    assert _constant_dtypes(plan.prepared) == {"float32"}


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(InvalidSpec, match="unknown precision 'int4'"):
        validate_spec(JobSpec(model_id="m", target=host_target(), trials=1, precision="int4"))


def test_bf16_on_a_cpu_with_avx512_bf16_and_nothing_packed_says_why() -> None:
    zen4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "znver3"})
    assert "avx512bf16, but no operator's weight packs" in precision_compute("bf16", zen4).note
    assert "no AVX512-BF16" in precision_compute("bf16", avx2).note
    assert precision_compute("as-is", zen4).mode == ""


def test_reduced_precision_accuracy_fails_beyond_the_norm_wise_tolerance() -> None:
    expected = [[np.ones(100, dtype=np.float32)]]
    close = [[np.ones(100, dtype=np.float32) * (1 + 1e-3)]]
    report = accuracy_report(
        close,
        expected,
        ["y"],
        [None],
        reference="untuned TVM (float32)",
        tolerance=RELATIVE_TOLERANCE["bf16"],
    )
    assert report.outputs[0].relative_error == pytest.approx(1e-3, rel=1e-3)
    require_accuracy(report)
    far = [[np.ones(100, dtype=np.float32) * 1.2]]
    report = accuracy_report(
        far, expected, ["y"], [None], reference="untuned TVM (float32)", tolerance=RELATIVE_TOLERANCE["bf16"]
    )
    with pytest.raises(VerificationFailed, match="y: relative error 0.2"):
        require_accuracy(report)


@pytest.mark.parametrize(
    ("mcpu", "native", "chosen"),
    [
        ("znver3", [], "as-is"),
        ("znver4", ["avx512bf16"], "bf16"),
        ("sapphirerapids", ["amx-bf16", "avx512bf16"], "bf16"),
    ],
)
def test_auto_is_bf16_where_the_cpu_multiplies_bf16_and_as_is_elsewhere(
    tmp_path: Path, mcpu: str, native: list[str], chosen: str
) -> None:
    """Planned for each CPU, not run on it: the choice follows the target's features, not this machine's."""
    target = to_tvm_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    assert native_bf16(target) == native
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(batch=4), path)
    fusion = plan_graph(load_model(path).mod, target, PlanningOptions(precision="auto")).fusion
    assert fusion.precision == chosen
    if chosen == "bf16":
        assert fusion.reduced_ops == ["matmul 4x256 @ 256x512 -> bf16", "matmul 4x512 @ 512x10 -> bf16"]
        assert (
            fusion.precision_choice == f"auto: bf16, which this CPU multiplies natively ({', '.join(native)})"
        )
    else:
        assert fusion.reduced_ops == [] and fusion.precision_compute == ""
        assert fusion.precision_choice.startswith("auto: as-is, since this CPU has no bf16 instructions")


def test_auto_is_a_policy_a_job_may_ask_for_and_the_others_say_nothing_of_a_choice(tmp_path: Path) -> None:
    validate_spec(JobSpec(model_id="m", target=host_target(), trials=1, precision="auto"))
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(batch=4), path)
    assert (
        plan_graph(
            load_model(path).mod, ZEN4_TARGET, PlanningOptions(precision="bf16")
        ).fusion.precision_choice
        == ""
    )
