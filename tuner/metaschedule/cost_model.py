"""The cost model a job starts from: MetaSchedule's XGBoost model trained on every schedule the store has
measured on the job's target, kept in the store and carried forward from job to job.

MetaSchedule's ``XGBModel`` starts untrained in every run: it ranks the first ~100 candidates of a run at
random, and learns only from what that run measures. Kiln is a service with a database of every schedule
it ever measured, so a job instead loads the model kept for its target and record scope (an owner's
records, or the shared pool ``*`` where ``KILN_SHARE_RECORDS`` is on), first teaches it the records
stored since it was kept (other jobs', other workers'; the newest :data:`CATCH_UP_LIMIT` of them, each
replayed on its workload to extract its features), tunes with it (MetaSchedule's ``UpdateCostModel``
retrains it as the job's batches arrive), and keeps it again at the end with what it learnt meanwhile.
The model is trained across workloads: each workload's costs are normalised to its best, and the
features (per buffer store: arithmetic, memory access, loop structure) say nothing about which workload
they came from, so a model trained on other kernels ranks a new kernel's candidates from its first batch.
"""

from __future__ import annotations

import json
import logging
import tempfile
import warnings
from collections import defaultdict
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import numpy as np

from kiln_tvm import (
    SCHEDULE_ERRORS,
    Target,
    derived_object,
    ms,
    physical_core_count,
    s_tir,
)
from tuner.entities import NewRecord, StoredCostModel
from tuner.metaschedule.database import readable_record
from tuner.store.sql import Store

log = logging.getLogger(__name__)

#: The most records a model learns when it is loaded or kept (the newest; older ones are skipped).
CATCH_UP_LIMIT = 2048
#: The scope of the shared pool of records (every owner's).
SHARED_SCOPE = "*"
#: The most samples a kept model holds (~270 bytes each in the store); the first-seen workloads' go first.
MAX_KEPT_SAMPLES = 50_000
#: XGBModel retrains when its samples have grown by a fifth; this holds a retrain off (see ``_learn``).
_NEVER = 1 << 60


def scope_key(scope: str | None) -> str:
    """The cost model's scope for a record scope (an owner, or None: the shared pool)."""
    return SHARED_SCOPE if scope is None else scope


def xgb_model(cores: int) -> Any:
    """An untrained XGBoost cost model, as MetaSchedule's tuning makes it."""
    return ms.cost_model.XGBModel(
        extractor=ms.feature_extractor.PerStoreFeature(), adaptive_training=True, num_tuning_cores=cores
    )


def trained_samples(model: Any) -> int:
    """The samples an XGBoost model ranks candidates with (0 while it still ranks them at random)."""
    if model.booster is None or model.data_size < model.num_warmup_samples:
        return 0
    return int(model.data_size)


def candidate_scores(
    features: list[np.ndarray], predict: Callable[[list[np.ndarray]], np.ndarray]
) -> np.ndarray:
    """One score per candidate from its per-store ``features``: ``predict`` (XGBoost summed over a
    candidate's stores) for the candidates that have any; the others, whose every store sits inside a tensor
    intrinsic's call where the extractor sees none (some ``vdpbf16ps`` schedules), get the mean of the rest,
    neither favoured nor starved, or random scores when no candidate has features. MetaSchedule's own
    pack-sum returns fewer scores than candidates when the last ones have none, and fails when none has."""
    described = [index for index, rows in enumerate(features) if len(rows)]
    if not described:
        return np.random.uniform(low=0, high=1, size=len(features))
    scores = np.asarray(predict([features[index] for index in described]), dtype="float64")
    filled = np.full(len(features), scores.mean())
    filled[described] = scores
    return filled


@derived_object
class RankingCostModel(ms.cost_model.PyCostModel):
    """An XGBoost model that notes, per task, how many samples had trained it when the search first asked
    it to rank the task's candidates (``first_ranked``: task name -> samples; 0: ranked at random)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.first_ranked: dict[str, int] = {}

    def load(self, path: str) -> None:
        """Load the wrapped model."""
        self.model.load(path)

    def save(self, path: str) -> None:
        """Save the wrapped model."""
        self.model.save(path)

    def update(self, context: Any, candidates: list[Any], results: list[Any]) -> None:
        """Teach the wrapped model a measured batch."""
        self.model.update(context, candidates, results)

    def predict(self, context: Any, candidates: list[Any]) -> Any:
        """Rank candidates with the wrapped model: one score each (:func:`candidate_scores`)."""
        self.first_ranked.setdefault(str(context.task_name), trained_samples(self.model))
        model = self.model
        if not trained_samples(model):
            return model.predict(context, candidates)  # at random, one score each
        features = [x.numpy().astype("float32") for x in model.extractor.extract_from(context, candidates)]
        return candidate_scores(features, model._predict)


def load_cost_model(store: Store, target: Target, target_key: str, scope: str | None) -> tuple[Any, int]:
    """The cost model kept for ``target_key`` and ``scope``, taught the records stored since; returns the
    model (a :class:`RankingCostModel`) and the newest record it has learnt (0: none)."""
    cores = physical_core_count()
    if target.kind.name == "llvm":
        cores = int(target.attrs.get("num-cores", cores))
    model = xgb_model(cores)
    kept = store.get_cost_model(target_key, scope_key(scope))
    last = 0
    if kept is not None:
        try:
            _load(model, kept.model_tar)
            last = kept.last_record_id
        except Exception as exc:  # noqa: BLE001 - a model that does not load is rebuilt from the records
            log.warning("the kept cost model of %s does not load (%s): training a new one", target_key, exc)
            model = xgb_model(cores)
    new = store.records_since(target_key, last, scope, CATCH_UP_LIMIT)
    learnt = _learn(model, new, target)
    if new:
        last = new[-1].id
    log.info(
        "cost model of %s: %d samples kept, %d records learnt now",
        target_key,
        model.data_size - learnt,
        learnt,
    )
    return RankingCostModel(model), last


def keep_cost_model(
    store: Store,
    ranking: Any,
    target: Target,
    *,
    target_key: str,
    scope: str | None,
    last: int,
    learnt: Collection[int],
) -> StoredCostModel | None:
    """Keep the model a tuning process searched with: taught every record stored since ``last`` that it
    did not learn while tuning (``learnt``: the ids of the records this process measured and stored),
    up to the newest record. Records another process stored meanwhile are taught whoever stored them:
    another job's, or another worker's group of the same split job. None when it never trained."""
    model = ranking.model
    new = store.records_since(target_key, last, scope, CATCH_UP_LIMIT)
    seen = set(learnt)
    _learn(model, [r for r in new if r.id not in seen], target)
    if model.booster is None:
        return None
    trim_samples(model, MAX_KEPT_SAMPLES)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.tar"
        with warnings.catch_warnings():  # XGBoost's note that model.bin is written as UBJSON
            warnings.simplefilter("ignore", UserWarning)
            model.save(str(path))
        kept = StoredCostModel(
            target_key,
            scope_key(scope),
            int(model.data_size),
            new[-1].id if new else last,
            path.read_bytes(),
        )
    store.save_cost_model(kept)
    return kept


def trim_samples(model: Any, cap: int) -> int:
    """Drop an XGBoost model's oldest training samples (the workloads it learnt first, then a workload's
    first samples) until it holds at most ``cap``, so that a kept model does not grow with the store; its
    trained booster is kept. Returns how many it dropped."""
    dropped = 0
    while model.data_size > cap and model.data:
        oldest = next(iter(model.data))
        group = model.data[oldest]
        excess = model.data_size - cap
        if len(group.features) <= excess:
            del model.data[oldest]
            removed = len(group.features)
        else:  # this workload keeps its newest samples
            group.features = group.features[excess:]
            group.costs = group.costs[excess:]
            group.min_cost = float(group.costs.min())
            removed = excess
        model.data_size -= removed
        dropped += removed
    model.last_train_size = min(model.last_train_size, model.data_size)
    return dropped


def _load(model: Any, tar: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.tar"
        path.write_bytes(tar)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            model.load(str(path))


def _learn(model: Any, records: list[NewRecord], target: Target) -> int:
    """Teach ``model`` ``records`` (each replayed on its workload for its features), training it once at
    the end; returns how many it learnt."""
    if not records:
        return 0
    by_workload: dict[int, list[NewRecord]] = defaultdict(list)
    for record in records:
        by_workload[record.workload_id].append(record)
    batches = []
    for group in by_workload.values():
        workload = ms.database.Workload.from_json(json.loads(group[0].workload_json))
        candidates, results = [], []
        for record in group:
            tuning = readable_record(record.record_json, workload)  # None: a newer Kiln's intrinsic
            if tuning is None:
                continue
            sch = s_tir.Schedule(workload.mod)
            try:
                tuning.trace.apply_to_schedule(sch, remove_postproc=False)
            except SCHEDULE_ERRORS:
                continue  # a trace of an older Kiln that no longer replays: nothing to learn from it
            candidates.append(ms.MeasureCandidate(sch, tuning.args_info))
            results.append(ms.runner.RunnerResult(run_secs=tuning.run_secs, error_msg=None))
        if candidates:
            context = ms.TuneContext(mod=workload.mod, target=target, task_name="learning")
            batches.append((context, candidates, results))
    learnt = 0
    state = model._inst  # noqa: SLF001 - XGBModel's retraining threshold lives on the Python object
    for index, (context, candidates, results) in enumerate(batches):
        # Retrain once, on the last batch, over everything: XGBModel retrains from scratch each time.
        state.last_train_size = 0 if index == len(batches) - 1 else _NEVER
        model.update(context, candidates, results)
        learnt += len(candidates)
    if batches:
        state.last_train_size = model.data_size
    return learnt
