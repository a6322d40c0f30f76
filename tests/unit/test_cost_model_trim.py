"""A kept cost model does not grow with the store: its oldest samples go first, its booster stays."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kiln_tvm import ms
from tuner.metaschedule.cost_model import trim_samples, xgb_model


def _group(name: str, costs: list[float]) -> object:
    features = [np.full((1, 4), i, dtype="float32") for i in range(len(costs))]
    return ms.cost_model.xgb_model.FeatureGroup(name, features, np.array(costs))


def _model(groups: dict[str, list[float]]) -> object:
    model = xgb_model(1)
    model.data = OrderedDict((name, _group(name, costs)) for name, costs in groups.items())
    model.data_size = sum(len(c) for c in groups.values())
    model.last_train_size = model.data_size
    return model


def test_the_first_learnt_workloads_go_first_then_a_workload_s_oldest_samples() -> None:
    model = _model({"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0], "c": [6.0, 7.0, 8.0, 9.0]})
    assert trim_samples(model, 5) == 4
    # "a" (3 samples) went whole, then the first of "b"'s two; "c" is untouched.
    assert list(model.data) == ["b", "c"]
    assert list(model.data["b"].costs) == [5.0] and model.data["b"].min_cost == 5.0
    assert [int(f[0, 0]) for f in model.data["b"].features] == [1]
    assert list(model.data["c"].costs) == [6.0, 7.0, 8.0, 9.0]
    assert model.data_size == 5 and model.last_train_size == 5


def test_a_model_within_the_cap_is_left_alone() -> None:
    model = _model({"a": [1.0, 2.0], "b": [3.0]})
    assert trim_samples(model, 3) == 0
    assert list(model.data) == ["a", "b"] and model.data_size == 3
