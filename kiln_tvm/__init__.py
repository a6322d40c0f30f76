"""Kiln's gate to TVM: the one package that imports TVM's paths, so that the next rename is a change here.

This module holds the runtime, IR, MetaSchedule and RPC names Kiln uses; :mod:`kiln_tvm.frontends` holds
the model importers and the internals of them Kiln reads.

Importing this module also asks Linux for AMX tile state (:func:`kiln_tvm.x86_amx.request_amx_permission`:
without it the first AMX instruction of a process is SIGILL) and fixes two traps of TVM 0.27 on x86 CPUs
before TVM starts:

* ``tvm_ffi`` imports PyTorch when it is installed, to hand tensors over through its C DLPack extension:
  1.9 s of PyTorch and 0.6 s of that extension, in every process that loads TVM (Kiln's sandboxes,
  builders, timing and tuning processes, the CLI), where none of them exchanges a tensor with PyTorch.
  In a process that has not imported PyTorch yet, TVM is loaded with PyTorch out of sight (see
  :func:`_import_tvm_without_torch`); PyTorch imports as usual afterwards, and tensors still pass through
  the DLPack protocol (``tvm.runtime.from_dlpack``), without the extension. A process that imported
  PyTorch first (a user's, compiling with ``backend="kiln"``) loads TVM with it, extension included;
* the runtime thread pool uses half of ``hardware_concurrency()`` unless ``TVM_NUM_THREADS`` is set,
  which on a machine without SMT means half of the real cores;
* ``import tvm.s_tir.tensor_intrin`` takes ~26 s (mostly CUDA intrinsics) and both ``TuneContext`` and the
  stock builder import it. Importing this module installs an import hook (:class:`_CpuTensorIntrinsics`)
  under which that import registers only the x86 intrinsics, with Kiln's own (a VNNI dot product that
  builds, AVX512-BF16's), whoever imports it first: no caller has to remember to register them before its
  first ``TuneContext``. Reading a stored record registers them too (its trace may tensorize:
  :func:`tuner.metaschedule.database.readable_record`); AMX's, whose parsing costs ~4 s, are added by
  ``register_cpu_tensor_intrinsics(amx=True)`` where AMX kernels are built or replayed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types


def physical_core_count() -> int:
    """Number of physical CPU cores (what TVM's thread pool should use)."""
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


os.environ.setdefault("TVM_NUM_THREADS", str(physical_core_count()))


def _import_tvm_without_torch() -> None:
    """Import ``tvm_ffi`` and ``tvm`` with ``import torch`` failing, unless PyTorch is imported already;
    then let PyTorch be imported again (a ``None`` in ``sys.modules`` makes an import raise ImportError,
    which ``tvm_ffi`` takes for PyTorch not installed)."""
    if "torch" in sys.modules:
        import tvm  # noqa: F401

        return
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        import tvm  # noqa: F401
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


_import_tvm_without_torch()

import tvm  # noqa: E402
import tvm.s_tir  # noqa: E402
import tvm_ffi  # noqa: E402
from tvm import relax, s_tir  # noqa: E402
from tvm.ir.utils import derived_object  # noqa: E402
from tvm.s_tir import dlight  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402
from tvm.s_tir.dlight.analysis import normalize_prim_func  # noqa: E402
from tvm.script import tirx as tir_script  # noqa: E402  TVMScript's TIR builder (``T``)
from tvm.target import Target  # noqa: E402

from kiln_tvm.x86_amx import request_amx_permission  # noqa: E402

request_amx_permission()

#: A Relax constant (TVM 0.27 names it ``GenericConst``, its tensor in ``.value``).
RelaxConstant = tvm.ir.expr.Constant

#: The root of MetaSchedule's loggers (its modules log under their own module names).
METASCHEDULE_LOGGER = ms.__name__

#: What TVM raises (through its FFI, as Python's built-in exceptions) when a schedule primitive refuses,
#: a trace does not replay on a module, or a block or loop is not where the trace expects it.
SCHEDULE_ERRORS: tuple[type[Exception], ...] = (
    RuntimeError,
    ValueError,
    TypeError,
    IndexError,
    AttributeError,
    KeyError,
)

_TENSOR_INTRIN = "tvm.s_tir.tensor_intrin"


class _CpuTensorIntrinsics(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Loads ``tvm.s_tir.tensor_intrin`` as Kiln needs it: a package whose import registers only the x86
    tensor intrinsics (TVM's ``tensor_intrin.x86`` module), Kiln's VNNI dot product in place of TVM's (one
    that builds, :mod:`kiln_tvm.x86_vnni`) and AVX512-BF16's (:mod:`kiln_tvm.x86_bf16`); not TVM's CUDA,
    ROCm, Metal or Arm ones. Its submodules stay importable by name.

    Only x86's: no schedule rule of Kiln's tensorizes with another CPU's, and ``arm_cpu``'s module takes
    5-12 s to parse (its ``T.prim_func`` decorators walk the stack of a process that has imported PyTorch).
    """

    def find_spec(
        self, fullname: str, path: object, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TENSOR_INTRIN:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = [os.path.join(os.path.dirname(tvm.s_tir.__file__), "tensor_intrin")]
        importlib.import_module(f"{_TENSOR_INTRIN}.x86")
        from kiln_tvm.x86_bf16 import register_dpbf16_intrinsic
        from kiln_tvm.x86_vnni import register_vnni_intrinsic

        register_vnni_intrinsic()
        register_dpbf16_intrinsic()


if not any(isinstance(finder, _CpuTensorIntrinsics) for finder in sys.meta_path):
    sys.meta_path.insert(0, _CpuTensorIntrinsics())


def register_cpu_tensor_intrinsics(amx: bool = False) -> None:
    """Register the CPU tensor intrinsics now (as ``import tvm.s_tir.tensor_intrin`` does under Kiln's
    hook, :class:`_CpuTensorIntrinsics`), before reading a trace that may tensorize or making a rule that
    looks its intrinsic up; with ``amx``, Kiln's AMX intrinsics (:mod:`kiln_tvm.x86_amx`) too. Idempotent."""
    importlib.import_module(_TENSOR_INTRIN)
    if amx:
        from kiln_tvm.x86_amx import register_amx_intrinsics

        register_amx_intrinsics()


def runner_device_type(target: Target) -> str:
    """The device name MetaSchedule's runners take for ``target`` ("cpu" for llvm, "cuda"...), as its task
    scheduler derives it (``DLDeviceType2Str`` of the target's device type)."""
    return str(tvm.runtime.Device._DEVICE_TYPE_TO_NAME[target.get_target_device_type()])


def structural_hash(obj: object) -> str:
    """The structural hash MetaSchedule uses to key workloads, as a decimal string."""
    return str(tvm_ffi.structural_hash(obj))


def structural_equal(lhs: object, rhs: object) -> bool:
    """Structural equality of two TVM IR objects."""
    return bool(tvm_ffi.structural_equal(lhs, rhs))


def estimate_flops(mod: tvm.IRModule) -> float:
    """FLOP count TVM estimates for a TIR module (0 when it cannot tell)."""
    try:
        return float(tvm.s_tir.analysis.estimate_tir_flops(mod))
    except Exception:  # noqa: BLE001 - the estimator rejects some opaque blocks; 0 means "unknown"
        return 0.0


__all__ = [
    "METASCHEDULE_LOGGER",
    "SCHEDULE_ERRORS",
    "PopenPoolExecutor",
    "PopenWorker",
    "RPCServer",
    "RPCTracker",
    "RelaxConstant",
    "StatusKind",
    "Target",
    "build_worker_func",
    "serialize_build_params",
    "build_candidate",
    "derived_object",
    "dlight",
    "estimate_flops",
    "ms",
    "physical_core_count",
    "register_cpu_tensor_intrinsics",
    "relax",
    "rpc_base",
    "normalize_prim_func",
    "runner_device_type",
    "s_tir",
    "structural_equal",
    "structural_hash",
    "tir_script",
    "tuning_record_json",
    "tvm",
    "tvm_ffi",
]


def build_candidate(mod: tvm.IRModule, target: Target, _params: object) -> object:
    """MetaSchedule builder function: TVM's ``default_build`` without the tensor-intrinsic import.

    ``LocalBuilder`` restarts its worker pool for every batch, and the stock function pays the ~26 s
    ``import tvm.s_tir.tensor_intrin`` in each new worker.
    """
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


def _plain_json(obj: object) -> object:
    """TVM JSON containers -> plain Python; IndexMaps become their ``save_json`` text.

    TVM 0.27's ``TuningRecord.as_json`` leaves the ``IndexMap`` of a ``TransformLayout`` instruction
    (emitted by weight-layout rewriting) in the tree, where Python's converter raises; the C++
    ``JSONDatabase`` writes it as ``save_json`` text, and ``TuningRecord.from_json`` reads that form.
    """
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, tvm.tirx.IndexMap):
        return tvm.ir.save_json(obj)
    if isinstance(obj, tvm.tirx.IntImm | tvm.tirx.FloatImm):
        return obj.value
    if isinstance(obj, tvm_ffi.Map | dict):
        return {str(_plain_json(k)): _plain_json(v) for k, v in obj.items()}
    if isinstance(obj, tvm_ffi.Array | list | tuple):
        return [_plain_json(item) for item in obj]
    raise TypeError(f"cannot convert {type(obj).__name__} in a tuning record to JSON")


def tuning_record_json(record: object) -> list[object]:
    """A MetaSchedule ``TuningRecord`` as plain JSON: ``[trace, run_secs, target, args_info]``."""
    return _plain_json(ms._ffi_api.TuningRecordAsJSON(record))  # type: ignore[attr-defined,return-value]


# TVM's RPC: the tracker's wire protocol (``rpc_base``), and the tracker and server processes.
from tvm.rpc import base as rpc_base  # noqa: E402
from tvm.rpc.server import Server as RPCServer  # noqa: E402
from tvm.rpc.tracker import Tracker as RPCTracker  # noqa: E402

# MetaSchedule's per-candidate build step, run inside builder worker processes.
from tvm.s_tir.meta_schedule.builder.local_builder import (  # noqa: E402
    _serialize_params as serialize_build_params,
)
from tvm.s_tir.meta_schedule.builder.local_builder import (  # noqa: E402
    _worker_func as build_worker_func,
)
from tvm.support.popen_pool import PopenPoolExecutor, PopenWorker, StatusKind  # noqa: E402

from kiln_tvm import popen_workers  # noqa: E402

# Builder and runner workers fork from one process that loaded TVM, not fresh interpreters.
popen_workers.install()
