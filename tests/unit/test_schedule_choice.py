"""The schedule of a kernel without a record of its own: the candidates built without measuring, and the
one a trained cost model predicts fastest among them, which compiles and computes the right result."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln_tvm import tvm
from schedules.poly.caches import host_caches
from tests.unit.test_transfer import matmul
from tuner.metaschedule.cost_model import RankingCostModel, trained_ranker, xgb_model
from tuner.schedule_choice import (
    ScheduleSource,
    unmeasured_schedule,
    untuned_candidates,
    untuned_schedule,
)
from tuner.targets import host_target, to_tvm_target

TARGET = to_tvm_target(host_target())
CACHES = host_caches()


class ScoresByPosition:
    """A cost model's ``predict`` whose score of each candidate is given in advance by its position."""

    def __init__(self, pick: int) -> None:
        self.pick = pick
        self.seen: list[Any] = []

    def predict(self, context: Any, candidates: list[Any]) -> np.ndarray:
        self.seen = list(candidates)
        return np.array([1.0 if i == self.pick else 0.1 * i for i in range(len(candidates))])


class Failing:
    """A cost model that cannot rank (its features do not extract, say)."""

    def predict(self, context: Any, candidates: list[Any]) -> np.ndarray:
        raise RuntimeError("no features")


def _trace(sch: Any) -> str:
    return str(sch.trace)


def test_a_matmul_has_several_model_tilings_to_rank_the_first_of_them_untuned_schedules() -> None:
    mod = matmul(128, 256, 64)
    found = untuned_candidates(mod, TARGET, "matmul", CACHES, 4)
    assert len(found) >= 2 and all(source is ScheduleSource.MODEL for source, _ in found)
    assert len({_trace(sch) for _, sch in found}) == len(found)  # different schedules
    source, first = untuned_schedule(mod, TARGET, "matmul", CACHES)
    assert source is ScheduleSource.MODEL and first is not None and _trace(first) == _trace(found[0][1])


def test_the_candidate_a_cost_model_predicts_fastest_is_chosen_and_computes_the_product() -> None:
    mod = matmul(128, 256, 64)
    found = untuned_candidates(mod, TARGET, "matmul", CACHES, 4)
    ranker = ScoresByPosition(pick=len(found) - 1)
    source, sch = unmeasured_schedule(None, mod, TARGET, "matmul", CACHES, ranker)
    assert len(ranker.seen) == len(found)
    assert source is ScheduleSource.MODEL and sch is not None and _trace(sch) == _trace(found[-1][1])

    lib = tvm.compile(sch.mod, target=TARGET)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 64), dtype=np.float32)
    b = rng.standard_normal((64, 256), dtype=np.float32)
    out = tvm.runtime.tensor(np.zeros((128, 256), np.float32))
    lib(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)


def test_a_cost_model_that_cannot_rank_leaves_the_order_of_trust() -> None:
    mod = matmul(128, 256, 64)
    source, sch = unmeasured_schedule(None, mod, TARGET, "matmul", CACHES, Failing())
    first_source, first = untuned_schedule(mod, TARGET, "matmul", CACHES)
    assert source is first_source and sch is not None and first is not None
    assert _trace(sch) == _trace(first)


def test_an_untrained_cost_model_ranks_nothing() -> None:
    # Below its warm-up samples MetaSchedule's XGBoost model scores candidates at random.
    model = xgb_model(2)
    assert model.data_size < model.num_warmup_samples
    assert trained_ranker(RankingCostModel(model)) is None
