"""Build a model with its tuned records applied (or plain, as TVM's baseline), and run it on the CPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kiln_tvm import Target, register_cpu_tensor_intrinsics, relax, tvm
from tuner.entities import ModelSignature, TensorSpec
from tuner.passes.plan import GraphPlan


def build_tuned(plan: GraphPlan, target: Target, database: Any) -> Any:
    """Compile the planned graph with the best record of each task from ``database``.

    Tasks without a record keep TVM's default (unscheduled) code. On CPU, weights are re-laid-out
    once at compile time to the layout the tuned kernels chose.
    """
    # Records of VNNI and AMX kernels replay a Tensorize instruction (AMX's only where the plan has some).
    register_cpu_tensor_intrinsics(amx=bool(plan.fusion.amx_matmuls or plan.fusion.amx_bf16_matmuls))
    with target, database, tvm.transform.PassContext(opt_level=3):
        mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(plan.lowered)
        if plan.weight_prepack:
            mod = tvm.transform.Sequential(
                [
                    split_layout_rewrites(),
                    relax.transform.LiftTransformParams(),
                    relax.transform.FoldConstant(),
                ]
            )(mod)
    return tvm.compile(mod, target=target)


def split_layout_rewrites() -> tvm.transform.Pass:
    """``SplitLayoutRewritePreproc`` (a tuned kernel's weight re-layout moved into its own kernel, run once)
    over the kernels that can hold such a re-layout: the scheduled ones.

    TVM's pass walks every PrimFunc of the module and fails on one whose body has no block (the kernels
    ``scatter_elements`` and ``dynamic_strided_slice`` legalize to); an unscheduled kernel has no re-layout
    to split, so those stay out of its sight and come back unchanged.
    """

    @tvm.transform.module_pass(opt_level=0, name="SplitLayoutRewritePreproc")
    def run(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        unscheduled = {
            gvar: func
            for gvar, func in mod.functions.items()
            if isinstance(func, tvm.tirx.PrimFunc)
            and not (func.attrs and func.attrs.get("tirx.is_scheduled"))
        }
        seen = mod.clone()
        for gvar in unscheduled:
            del seen[gvar]
        split = relax.transform.SplitLayoutRewritePreproc()(seen)
        for gvar, func in unscheduled.items():
            split[gvar] = func
        return split

    return run


def model_assembly(executable: Any) -> str:
    """The assembly LLVM generates for a compiled model's kernels ("" when it has no LLVM module)."""
    sources = [m.inspect_source("asm") for m in executable.mod.imports if m.kind == "llvm"]
    return "".join(sources)


def build_untuned(imported: tvm.IRModule, target: Target) -> Any:
    """What a user gets from plain ``tvm.compile`` of the imported model: TVM's untuned baseline."""
    return tvm.compile(imported, target=target)


def random_inputs(signature: ModelSignature, seed: int = 0) -> list[np.ndarray]:
    """Seeded random inputs for every model input (normal floats, small non-negative integers)."""
    rng = np.random.default_rng(seed)
    return [_random_tensor(spec, rng) for spec in signature.inputs]


def _random_tensor(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    shape = tuple(int(d) for d in spec.shape)
    dtype = np.dtype(spec.dtype) if spec.dtype != "bool" else np.dtype(bool)
    if dtype == np.dtype(bool):
        return rng.integers(0, 2, size=shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 8, size=shape).astype(dtype)
    return rng.standard_normal(size=shape).astype(dtype)


def _flatten(out: Any) -> list[np.ndarray]:
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    if hasattr(out, "numpy"):
        return [out.numpy()]
    if isinstance(out, list | tuple) or hasattr(out, "__len__"):
        flat: list[np.ndarray] = []
        for item in out:
            flat.extend(_flatten(item))
        return flat
    return [np.asarray(out)]


class LoadedModel:
    """A compiled model on the CPU, callable with numpy arrays."""

    def __init__(self, executable: Any, device: Any | None = None) -> None:
        self.device = device or tvm.cpu()
        self.vm = relax.VirtualMachine(executable, self.device)
        self.params: list[Any] = []
        if self.vm.module.implements_function("main_transform_params"):
            # Weights are constants, so the transform takes none; it returns the prepacked ones.
            self.params = list(self.vm["main_transform_params"]([]))

    def _args(self, inputs: list[np.ndarray]) -> list[Any]:
        return [tvm.runtime.tensor(x, self.device) for x in inputs] + self.params

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run once and return every output as numpy."""
        return _flatten(self.vm["main"](*self._args(inputs)))

    def bound_call(self, inputs: list[np.ndarray]) -> Callable[[], Any]:
        """``main`` with its arguments already converted: what a latency measurement should time."""
        args = self._args(inputs)
        main = self.vm["main"]
        return lambda: main(*args)
