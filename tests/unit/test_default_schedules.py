"""Default schedules: the rules that serve softmax and layer norm apply to them, and compute what the
unscheduled kernel computes. Fast math: exp and erf become their approximations, outputs unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from kiln_tvm import ms, s_tir, structural_equal, tvm
from schedules import row_reduction
from schedules.defaults import default_schedule
from schedules.loops import fp32_lanes
from tests.artifacts import onnxruntime_output
from tests.model_builders import build_attention_scores
from tuner.compile import LoadedModel, build_untuned
from tuner.entities import PlanningOptions
from tuner.frontend import load_model
from tuner.passes.plan import GraphPlan, plan_graph
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> GraphPlan:
    path: Path = tmp_path_factory.mktemp("attention") / "attention.onnx"
    onnx.save(build_attention_scores(), path)
    return plan_graph(load_model(path).mod, TARGET)


def _task(plan: GraphPlan, word: str) -> tvm.IRModule:
    (mod,) = [t.dispatched[0] for t in plan.tasks if word in str(t.task_name)]
    return mod


def _run(mod: tvm.IRModule, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = [
        rng.standard_normal([int(d) for d in info.shape]).astype(str(info.dtype))
        for info in ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    ]
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    tvm.compile(mod, target=TARGET)(*args)
    return [a.numpy() for a in args]


@pytest.mark.parametrize("word", ["softmax", "layer_norm"])
def test_reductions_get_a_default_schedule_that_computes_the_same(plan: GraphPlan, word: str) -> None:
    mod = _task(plan, word)
    sch = default_schedule(mod, TARGET)
    assert sch is not None, f"no rule for {word}"
    # The trace replays on the task's own module: what the database stores and compile applies.
    assert len(sch.trace.insts) > 0
    replayed = s_tir.Schedule(mod)
    sch.trace.apply_to_schedule(replayed, remove_postproc=False)
    assert structural_equal(replayed.mod, sch.mod)
    # The output (last buffer) matches the unscheduled kernel's.
    expected, got = _run(mod)[-1], _run(sch.mod)[-1]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert "parallel" in sch.mod.script()
    # Kiln's row-reduction rule took it: every reduction is factored into a vector of partials per row.
    unscheduled = s_tir.Schedule(mod)
    blocks = [unscheduled.get(b) for b in unscheduled.get_child_blocks(unscheduled.get_sblock("root"))]
    reductions = [b.name_hint for b in blocks if any(int(iv.iter_type) == 2 for iv in b.iter_vars)]
    assert reductions
    for name in reductions:
        loops = sch.get_loops(sch.get_sblock(f"{name}_rf_update"))  # its update, after its init
        (vector,) = [loop for loop in loops if sch.get(loop).kind == tvm.tirx.ForKind.VECTORIZED]
        assert int(sch.get(vector).extent) == fp32_lanes(TARGET)


def test_a_reduction_along_an_outer_axis_is_left_to_dlight() -> None:
    te = tvm.te
    x = te.placeholder((1, 7, 7, 64), name="x")
    rh, rw = te.reduce_axis((0, 7), "rh"), te.reduce_axis((0, 7), "rw")
    total = te.compute((1, 64), lambda n, c: te.sum(x[n, rh, rw, c], axis=[rh, rw]), name="sum")
    mean = te.compute((1, 64), lambda n, c: total[n, c] / 49.0, name="mean")
    func = te.create_prim_func([x, mean])
    assert row_reduction.row_reduction_schedule(func, TARGET) is None


def test_matmuls_get_no_default_schedule(plan: GraphPlan) -> None:
    matmuls = [t.dispatched[0] for t in plan.tasks if "matmul" in str(t.task_name)]
    assert len(matmuls) == 2
    assert all(default_schedule(mod, TARGET) is None for mod in matmuls)


@pytest.mark.parametrize("fast_math", [True, False])
def test_fast_math_replaces_exp_and_erf_and_keeps_the_outputs(tmp_path: Path, fast_math: bool) -> None:
    path = tmp_path / "attention.onnx"
    onnx.save(build_attention_scores(), path)
    plan = plan_graph(load_model(path).mod, TARGET, PlanningOptions(fast_math=fast_math))
    names = [str(t.task_name) for t in plan.tasks]
    assert any("fast_softmax" in n for n in names) is fast_math, names
    assert any("fast_erf" in n for n in names) is fast_math, names
    assert any("erf" in n for n in names), names  # fused into the last matmul's epilogue either way
    script = plan.lowered.script()
    assert ("T.exp(" in script) is not fast_math and ("T.erf(" in script) is not fast_math

    x = np.random.default_rng(0).standard_normal((1, 64, 32)).astype(np.float32) * 3
    got = LoadedModel(build_untuned(plan.prepared, TARGET)).run([x])[0]
    np.testing.assert_allclose(got, onnxruntime_output(path, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("reduction", "rule_applies"), [(48, False), (128, True)])
def test_a_rule_that_would_predicate_a_vectorized_loop_is_not_taken(
    reduction: int, rule_applies: bool
) -> None:
    """dlight's GEMV splits the reduction by 64 under 128 vectorized output lanes: a reduction of 48 leaves
    a predicate inside the vectorized loop, which TVM writes out lane by lane (EfficientNet-B0's
    squeeze-excite convolution did not compile in minutes). Kiln leaves such a kernel to its other
    schedules; a reduction the split divides keeps the rule."""
    from kiln_tvm import dlight
    from schedules.defaults import predicated_under_vectorized

    x = tvm.te.placeholder((1, reduction), "float32", name="x")
    w = tvm.te.placeholder((1152, reduction), "float32", name="w")
    r = tvm.te.reduce_axis((0, reduction), name="r")
    y = tvm.te.compute((1, 1152), lambda b, i: tvm.te.sum(x[b, r] * w[i, r], axis=r), name="y")
    mod = tvm.IRModule({"main": tvm.te.create_prim_func([x, w, y])})
    gemv = dlight.cpu.GEMV().apply(mod["main"], TARGET, False)
    assert gemv is not None and predicated_under_vectorized(gemv.mod["main"]) is not rule_applies
    assert (default_schedule(mod, TARGET) is not None) is rule_applies


def test_a_softmax_over_rows_of_no_whole_vectors_gets_the_row_rule_scalar() -> None:
    """ViT's attention rows hold 197 scores, a prime: no vector width divides them. The row rule still
    takes the softmax (rows in parallel, each row reduced and written scalar), where it used to fall to a
    design-space sample that ran 100x slower, and computes what the unscheduled kernel does."""
    bb = tvm.relax.BlockBuilder()
    x = tvm.relax.Var("x", tvm.relax.TensorType((1, 6, 197, 197), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(tvm.relax.op.nn.softmax(x, axis=-1)))
        bb.emit_func_output(out)
    with TARGET:
        lowered = tvm.relax.get_pipeline("zero")(bb.get())
    (task,) = ms.relax_integration.extract_tasks(lowered, TARGET)
    mod = task.dispatched[0]
    sch = row_reduction.row_reduction_schedule(mod["main"], TARGET)
    assert sch is not None
    script = sch.mod.script()
    assert "T.parallel" in script and "T.vectorized" not in script  # no predicated vector lanes
    assert default_schedule(mod, TARGET) is not None
    expected, got = _run(mod)[-1], _run(sch.mod)[-1]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-5)
