"""A candidate kernel that crashes while measured is a failed candidate; the batch goes on."""

from __future__ import annotations

import pytest
import tvm
from tvm.script import tirx as T

from kiln_tvm import ms
from tuner.metaschedule.builder import PooledBuilder
from tuner.tune import MeasureConfig, make_runner

pytestmark = pytest.mark.slow


@T.prim_func
def _writes_far_out_of_bounds(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")) -> None:
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    for i in range(16):
        b[i * 100000000] = a[i]  # gigabytes past the end: SIGSEGV


@T.prim_func
def _adds_one(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")) -> None:
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    for i in range(16):
        b[i] = a[i] + T.float32(1)


def test_a_segfaulting_candidate_fails_alone_and_the_others_are_measured() -> None:
    target = tvm.target.Target({"kind": "llvm"})
    funcs = [_writes_far_out_of_bounds, _adds_one, _writes_far_out_of_bounds, _adds_one]
    mods = [tvm.IRModule({"main": f}) for f in funcs]
    builder = PooledBuilder(max_workers=1)
    try:
        built = builder.build([ms.builder.BuilderInput(mod, target) for mod in mods])
    finally:
        builder.shutdown()
    assert [b.error_msg for b in built] == [None] * 4

    config = MeasureConfig(number=1, min_repeat_ms=1)
    runner = make_runner(config)
    inputs = [
        ms.runner.RunnerInput(b.artifact_path, "cpu", ms.arg_info.ArgInfo.from_prim_func(mod["main"]))
        for b, mod in zip(built, mods, strict=True)
    ]
    results = [future.result() for future in runner.run(inputs)]

    for crashed in results[0::2]:
        assert crashed.run_secs is None
        assert "Subprocess terminated" in crashed.error_msg
    for good in results[1::2]:
        assert good.error_msg is None
        assert len(good.run_secs) == config.repeat and all(float(s) > 0 for s in good.run_secs)
