"""The cost model kept in the store: trained by one job's measurements, loaded by the next job (of another
model) to rank its first batch, and kept again with what that job measured."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.cost_model_catch_up import catch_up_in_fresh_process
from tests.host_jobs import run_host_job
from tests.model_builders import build_mlp, build_small_cnn
from tuner.entities import JobStatus
from tuner.metaschedule.cost_model import SHARED_SCOPE
from tuner.settings import Settings
from tuner.store import Store

pytestmark = pytest.mark.slow

#: MetaSchedule's XGBModel ranks at random below this many samples (its num_warmup_samples).
WARMUP_SAMPLES = 100


def _run(store: Store, settings: Settings, path: Path, trials: int):
    result = run_host_job(store, settings, path, trials=trials)
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    return result


def test_a_job_s_first_batch_is_ranked_by_the_cost_model_earlier_jobs_trained(
    sqlite_store: Store, settings: Settings, tmp_path: Path
) -> None:
    onnx.save(build_small_cnn(), str(tmp_path / "cnn.onnx"))
    first = _run(sqlite_store, settings, tmp_path / "cnn.onnx", trials=112)
    key = first.job.target_key
    kept = sqlite_store.get_cost_model(key, "")  # the CLI's records: owner ""
    assert sqlite_store.get_cost_model(key, SHARED_SCOPE) is None  # records are not shared by default
    assert kept is not None and kept.model_tar
    records = sqlite_store.records_since(key, 0)
    assert kept.last_record_id == records[-1].id
    assert WARMUP_SAMPLES <= kept.samples <= len(records)
    # A model that has not learnt them (the shared pool's: none is kept) catches up on every one of them,
    # in a process that has only just loaded TVM, with none of TVM's tensor intrinsics beyond the CPU's.
    caught_up = catch_up_in_fresh_process(settings.resolved_database_url, key)
    assert caught_up == {"learnt": len(records), "last": records[-1].id, "gpu_intrinsics_loaded": False}

    onnx.save(build_mlp(), str(tmp_path / "mlp.onnx"))
    second = _run(sqlite_store, settings, tmp_path / "mlp.onnx", trials=16)
    ranked = {
        t.name: t.search_stats["ranked_with_samples"]
        for t in sqlite_store.list_tasks(second.job.id)
        if t.search_stats and "ranked_with_samples" in t.search_stats
    }
    # Every task the search ranked was ranked, from its first batch, by the model the first job kept
    # (and what the second job measured before the search: its default schedules and seeds).
    assert ranked and all(n >= kept.samples for n in ranked.values()), (ranked, kept.samples)
    again = sqlite_store.get_cost_model(key, "")
    assert again is not None and again.last_record_id == sqlite_store.records_since(key, 0)[-1].id
    assert again.samples > kept.samples  # it learnt the second job's measurements as they came
