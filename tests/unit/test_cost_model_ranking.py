"""The cost model ranks every candidate the search asks about, one score each, including the candidates
whose every store sits inside a tensor intrinsic's call, where MetaSchedule's feature extractor sees none
(some ``vdpbf16ps`` schedules): its own pack-sum returned fewer scores than candidates when the last ones
had none, and failed a bf16 BERT job when a whole batch had none."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kiln_tvm import ms, relax, tvm
from schedules.vnni import PACKED_BLOCKS, has_avx512_bf16
from tests.schedule_candidates import sampled_candidates
from tuner.metaschedule.cost_model import RankingCostModel, candidate_scores
from tuner.passes.bf16_packing import Bf16AmxReport, pack_for_amx_bf16
from tuner.targets import host_target, to_tvm_target

HOST = to_tvm_target(host_target())
ZEN4 = HOST if has_avx512_bf16(HOST) else to_tvm_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})


def test_candidates_without_features_score_the_mean_of_the_others() -> None:
    features = [np.ones((2, 3), np.float32), np.zeros((0, 3), np.float32), 3 * np.ones((1, 3), np.float32)]
    scores = candidate_scores(features, lambda xs: np.array([x.sum() for x in xs]))
    np.testing.assert_array_equal(scores, [6.0, 7.5, 9.0])
    # None with features: one random score each, not a failure.
    alone = candidate_scores([np.zeros((0, 3), np.float32)] * 4, lambda xs: np.zeros(len(xs)))
    assert alone.shape == (4,) and np.all((alone >= 0) & (alone <= 1))


def _dpbf16_kernel() -> tvm.IRModule:
    weight = np.ones((256, 512), np.float32).astype(ml_dtypes.bfloat16)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 256), "bfloat16"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.matmul(x, relax.const(weight, "bfloat16"), out_dtype="float32")))
    lowered = relax.get_pipeline("zero")(pack_for_amx_bf16(Bf16AmxReport(amx=False, dot=True))(bb.get()))
    (func,) = [
        f
        for f in lowered.functions.values()
        if isinstance(f, tvm.tirx.PrimFunc) and any(mark in f.script() for mark in PACKED_BLOCKS)
    ]
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


@pytest.mark.slow
def test_a_trained_model_scores_every_vdpbf16ps_candidate_featureless_ones_included() -> None:
    kernel = _dpbf16_kernel()
    context = ms.TuneContext(mod=kernel, target=ZEN4, task_name="dpbf16", num_threads=2)
    candidates = [
        ms.MeasureCandidate(c, ms.arg_info.ArgInfo.from_prim_func(c.mod["main"]))
        for c in sampled_candidates(kernel, ZEN4, 8)
    ]
    rows = [len(x.numpy()) for x in ms.feature_extractor.PerStoreFeature().extract_from(context, candidates)]
    assert 0 in rows and any(rows), rows  # the case at hand: some candidates have no features
    model = RankingCostModel(
        ms.cost_model.XGBModel(extractor=ms.feature_extractor.PerStoreFeature(), num_warmup_samples=1)
    )
    results = [
        ms.runner.RunnerResult(run_secs=[1e-5 * (i + 1)], error_msg=None) for i in range(len(candidates))
    ]
    model.update(context, candidates, results)
    scores = model.predict(context, candidates)
    assert scores.shape == (len(candidates),) and np.all(np.isfinite(scores))
    featureless = [c for c, n in zip(candidates, rows, strict=True) if n == 0]
    assert model.predict(context, featureless).shape == (len(featureless),)
