"""A kernel indexed by an integer argument (an embedding's token ids), built for this CPU: what the local
and RPC runners must measure with valid indices."""

from __future__ import annotations

from typing import Any

from kiln_tvm import ms, tvm
from kiln_tvm import tir_script as T
from tuner.metaschedule.builder import PooledBuilder


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
