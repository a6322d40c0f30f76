"""A kernel indexed by an integer argument (an embedding's token ids) is measured with valid indices:
MetaSchedule's random bits would make it read far outside its table and crash on every candidate."""

from __future__ import annotations

from typing import Any

import pytest

from kiln_tvm import ms, tvm
from kiln_tvm import tir_script as T
from tuner.metaschedule.builder import PooledBuilder
from tuner.tune import MeasureConfig, make_runner

pytestmark = pytest.mark.slow


@T.prim_func
def gathers_rows(
    table: T.Buffer((64, 16), "float32"), ids: T.Buffer((8,), "int64"), out: T.Buffer((8, 16), "float32")
) -> None:
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    for i, j in T.grid(8, 16):
        out[i, j] = table[ids[i], j]


def built_gather() -> tuple[Any, list[Any]]:
    """The gather kernel built for this CPU: its runner input's artifact path and argument infos."""
    mod = tvm.IRModule({"main": gathers_rows})
    builder = PooledBuilder(max_workers=1)
    try:
        (built,) = builder.build([ms.builder.BuilderInput(mod, tvm.target.Target({"kind": "llvm"}))])
    finally:
        builder.shutdown()
    assert built.error_msg is None, built.error_msg
    return built.artifact_path, ms.arg_info.ArgInfo.from_prim_func(mod["main"])


def test_a_gather_is_measured_locally() -> None:
    path, args = built_gather()
    config = MeasureConfig(number=1, min_repeat_ms=1)
    (future,) = make_runner(config).run([ms.runner.RunnerInput(path, "cpu", args)])
    result = future.result()
    assert result.error_msg is None, result.error_msg
    assert len(result.run_secs) == config.repeat
