"""MetaSchedule workloads and records for store-level tests: a matmul TIR module, the CPU target, a record
of it with given run times, and a job to hang records on."""

from __future__ import annotations

import logging

from kiln_tvm import ms, s_tir, tvm
from tuner.entities import JobSpec, ModelFormat, ModelSignature
from tuner.store import Store

TARGET_KEY = "llvm|test-cpu|num-cores=2"
OTHER_TARGET_KEY = "llvm|another-cpu|num-cores=2"


def matmul(n: int = 64, relu: bool = False) -> tvm.IRModule:
    """An n x n x n float32 matmul (with a fused ReLU) as a TIR module (a fresh object each call)."""
    te = tvm.te
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    if relu:
        d = te.compute((n, n), lambda i, j: te.max(c[i, j], tvm.tirx.const(0, "float32")), name="D")
        return tvm.IRModule({"main": te.create_prim_func([a, b, d])})
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def target(mcpu: str | None = None) -> tvm.target.Target:
    """The machine's CPU, 2 cores, as MetaSchedule wants it."""
    return tvm.target.Target(
        {"kind": "llvm", "mcpu": mcpu or tvm.target.codegen.llvm_get_system_cpu(), "num-cores": 2}
    )


def make_record(mod: tvm.IRModule, run_secs: list[float]) -> ms.database.TuningRecord:
    """A record with an empty trace (the unscheduled function) and the given run times."""
    func = mod["main"]
    return ms.database.TuningRecord(
        s_tir.Schedule(mod).trace,
        ms.database.Workload(mod),
        run_secs,
        target(),
        ms.arg_info.ArgInfo.from_prim_func(func),
    )


def detach_unnamed_ms_log_handlers() -> None:
    """Work around MetaSchedule's logging setup failing on a second tuning run inside pytest.

    pytest (>= 8) attaches its unnamed capture handlers to non-propagating loggers, such as the one
    MetaSchedule configures on its first run; on the next run MetaSchedule's ``create_loggers`` lists
    the logger's handler names, meets ``None`` and fails with "'NoneType' object has no attribute 'format'".
    """
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in [h for h in logger.handlers if h.get_name() is None]:
        logger.removeHandler(handler)


def make_job(store: Store, target_key: str = TARGET_KEY) -> str:
    model, _ = store.add_model(
        name="matmul",
        format=ModelFormat.ONNX,
        sha256="0" * 64,
        size_bytes=1,
        signature=ModelSignature(inputs=(), outputs=()),
        blob_path="models/0.onnx",
    )
    spec = JobSpec(model_id=model.id, target={"kind": "llvm", "num-cores": 2}, trials=8)
    return store.create_job(spec, target_key).id
