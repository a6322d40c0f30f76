"""Graph passes and task extraction on the example CNN (no tuning)."""

from __future__ import annotations

from pathlib import Path

from kiln_tvm import relax
from tuner.entities import PlanningOptions
from tuner.frontend import load_model
from tuner.passes.plan import plan_graph
from tuner.targets import host_target, to_tvm_target

CNN = Path(__file__).resolve().parents[2] / "examples" / "small_cnn.onnx"


def _conv_layouts(mod) -> set[str]:
    layouts: set[str] = set()

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.nn.conv2d":
            layouts.add(str(expr.attrs.data_layout))

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return layouts


def test_cpu_plan_converts_convolutions_to_nhwc_and_fuses_batch_norm() -> None:
    imported = load_model(CNN)
    plan = plan_graph(imported.mod, to_tvm_target(host_target()))

    assert _conv_layouts(plan.prepared) == {"NHWC"}
    assert plan.weight_prepack
    assert plan.fusion.operator_histogram["relax.nn.batch_norm"] == 2
    assert "relax.nn.batch_norm" not in str(plan.prepared)
    conv_tasks = [t for t in plan.infos if "conv2d" in t.name]
    assert len(conv_tasks) == 3
    assert any("subtract" in t.name for t in conv_tasks)  # batch-norm fused into the conv epilogue
    assert all(t.flops > 0 and t.workload_hash.isdigit() and "T.prim_func" in t.tir for t in conv_tasks)
    assert plan.fusion.kernels_after < plan.fusion.operators_before


def test_nchw_keeps_the_model_layout() -> None:
    imported = load_model(CNN)
    plan = plan_graph(
        imported.mod,
        to_tvm_target(host_target()),
        PlanningOptions(weight_prepack=False, cpu_conv_layout="NCHW"),
    )

    assert _conv_layouts(plan.prepared) == {"NCHW"}
    assert not plan.weight_prepack
