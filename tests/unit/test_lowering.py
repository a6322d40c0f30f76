"""A model's lowering, level by level: one level per graph pass (TVM's zero pipeline opened into its
steps, the passes run inside a step kept in it), each with a summary whose counts add up, stored per job
compressed and served by position."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.model_builders import build_small_cnn
from tests.store_rows import add_job
from tuner.entities import IrLevel
from tuner.errors import NotFound
from tuner.frontend import load_model
from tuner.passes.levels import IMPORTED
from tuner.passes.plan import plan_graph
from tuner.store import Store
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())


@pytest.fixture(scope="module")
def levels(tmp_path_factory: pytest.TempPathFactory) -> list[IrLevel]:
    path = tmp_path_factory.mktemp("cnn") / "cnn.onnx"
    onnx.save(build_small_cnn(), path)
    plan = plan_graph(load_model(path).mod, TARGET, record_levels=True)
    return plan.levels


def test_each_graph_pass_is_a_level_and_the_zero_pipeline_its_steps(levels: list[IrLevel]) -> None:
    names = [level.name for level in levels]
    assert names[0] == IMPORTED and [level.position for level in levels] == list(range(len(levels)))
    # Kiln's passes, then TVM's zero pipeline step by step (with Kiln's lookup tables marked elementwise),
    # then the layout-free weights.
    for expected in ("ConvertLayout", "DecomposeOpsForInference", "EliminateCommonSubexpr", "FoldConstant"):
        assert any(name.startswith(expected.removesuffix("ForInference")) for name in names), (
            expected,
            names,
        )
    steps = [
        "LegalizeOps",
        "AnnotateTIROpPattern",
        "KilnLookupsAsElementwise",
        "FoldConstant",
        "FuseOps",
        "FuseTIR",
    ]
    start = names.index("LegalizeOps")
    assert names[start : start + len(steps)] == steps and names[-1] == "AttachAttrLayoutFreeBuffers"
    # Passes run inside a step (FoldConstant builds kernels with TIR's whole pipeline) are not levels.
    assert not [name for name in names if name.startswith(("tirx.", "s_tir.")) or name == "sequential"]


def test_the_summaries_add_up_and_follow_the_program(levels: list[IrLevel]) -> None:
    for before, after in zip(levels, levels[1:], strict=False):
        assert after.operators_before == before.operators_after
        assert after.operators_after == sum(after.histogram.values())
        assert after.operators_after - after.operators_before == sum(after.delta.values())
        assert after.changed == bool(after.text)  # an unchanged level stores no text of its own
    imported = levels[0]
    assert "R.nn.conv2d" in imported.text and imported.kernels == 0 and imported.prim_funcs == 0
    by_name = {level.name: level for level in levels}
    layout = by_name["ConvertLayout"]
    assert layout.changed and layout.delta["relax.permute_dims"] > 0 and 'data_layout="NHWC"' in layout.text
    legalized = by_name["LegalizeOps"]
    assert legalized.changed and legalized.kernels > 0 and "relax.nn.conv2d" not in legalized.histogram
    fused = by_name["FuseTIR"]
    assert fused.kernels < legalized.kernels and fused.prim_funcs > 0
    assert all(level.text.count("@R.function") >= 1 for level in levels if level.changed)
    assert "@T.prim_func" not in fused.text  # the TIR kernels are shown per task, not in the graph's levels


def test_levels_are_kept_per_job_and_an_unchanged_one_reads_the_text_before_it(
    store: Store, levels: list[IrLevel]
) -> None:
    job_id = add_job(store)
    store.set_ir_levels(job_id, levels)
    listed = store.list_ir_levels(job_id)
    assert [level.name for level in listed] == [level.name for level in levels]
    assert all(level.text == "" for level in listed) and listed[3].histogram == levels[3].histogram
    for level in levels:
        stored = store.get_ir_level(job_id, level.position)
        last_text = next(lv.text for lv in reversed(levels[: level.position + 1]) if lv.changed)
        assert stored.text == last_text and stored.delta == level.delta and stored.seconds == level.seconds
    # A resumed job plans again: its levels replace the earlier attempt's.
    store.set_ir_levels(job_id, levels[:2])
    assert len(store.list_ir_levels(job_id)) == 2
    with pytest.raises(NotFound, match="no lowering level 5"):
        store.get_ir_level(job_id, 5)


def test_a_plan_records_no_levels_unless_asked(tmp_path: Path) -> None:
    path = tmp_path / "cnn.onnx"
    onnx.save(build_small_cnn(), path)
    assert plan_graph(load_model(path).mod, TARGET).levels == []
