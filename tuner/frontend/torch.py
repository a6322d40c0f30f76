"""torch.export import: load a checked .pt2 archive with pickle disabled, decompose to core ATen,
refuse operators TVM lacks, convert, and bind the program's symbolic sizes to the given shapes."""

from __future__ import annotations

import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tuner.entities import ModelFormat, ModelSignature, TensorSpec
from tuner.errors import InvalidModel, InvalidSpec, MissingDependency, UnsupportedOperator
from tuner.frontend.imported import (
    ImportedModel,
    check_param_count,
    conversion_error,
    imported_model,
    output_names,
    quiet_importer,
    short_error,
    static_int,
    tvm_frontends,
)
from tuner.frontend.pt2_archive import check_archive, check_pickled_members, force_weights_only_load
from tuner.frontend.shapes import format_shape, resolve_input_shapes
from tuner.frontend.torch_rewrites import drop_empty_cat_operands

if TYPE_CHECKING:
    from kiln_tvm import tvm

TORCH_PIN = "torch==2.13.0"
#: Default bound on a .pt2 archive's total uncompressed size (``KILN_MAX_UNPACKED_MB`` sets it per call).
DEFAULT_MAX_UNPACKED_BYTES = 4096 << 20


def import_torch() -> ModuleType:
    force_weights_only_load()  # before torch reads anything: its loaders' fallbacks stay restricted
    try:
        import torch
    except ImportError:
        raise MissingDependency(
            f"loading .pt2 programs needs PyTorch: pip install 'kiln-autotune[torch]' ({TORCH_PIN})"
        ) from None
    except OSError as err:  # a broken install (missing shared libraries)
        raise MissingDependency(
            f"loading .pt2 programs needs a working PyTorch ({TORCH_PIN}); importing it failed: {short_error(err)}"
        ) from None
    return torch


def load_program(torch: ModuleType, path: Path, max_unpacked_bytes: int) -> Any:
    """``torch.export.load`` of an archive that passed :mod:`tuner.frontend.pt2_archive`'s checks, pickle disabled."""
    check_archive(path, max_unpacked_bytes)
    check_pickled_members(torch, path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.load(str(path))
    except Exception as err:  # noqa: BLE001 - zip, json, pickle and torch errors alike
        reason = "the zip archive is truncated or damaged" if isinstance(err, zipfile.BadZipFile) else ""
        detail = f"{reason} ({short_error(err)})" if reason else short_error(err)
        raise InvalidModel(
            f"could not read '{path.name}' as a torch.export program (torch.export.save): {detail}"
        ) from None


def _torch_tensor_spec(torch: ModuleType, name: str, value: Any, model_name: str) -> TensorSpec:
    if not isinstance(value, torch.Tensor):
        raise InvalidModel(
            f"'{model_name}': '{name}' is a {type(value).__name__}, not a tensor; Kiln imports programs "
            "whose inputs and outputs are tensors"
        )
    dims = tuple(int(d) if isinstance(d, int) else str(d) for d in value.shape)
    return TensorSpec(name=name, shape=dims, dtype=str(value.dtype).removeprefix("torch."))


def program_signature(program: Any, model_name: str) -> ModelSignature:
    torch = import_torch()
    sig = program.graph_signature
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    inputs = tuple(
        _torch_tensor_spec(torch, name, placeholders[name].meta.get("val"), model_name)
        for name in sig.user_inputs
    )
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    values = (
        list(output_node.args[0]) if isinstance(output_node.args[0], tuple | list) else [output_node.args[0]]
    )
    kind = torch.export.graph_signature.OutputKind
    user = [
        v
        for v, spec in zip(values, sig.output_specs, strict=False)
        if spec.kind in (kind.USER_OUTPUT, kind.LOSS_OUTPUT)
    ]
    metas = [v.meta.get("val") if hasattr(v, "meta") else v for v in user]
    tensors = [m for m in metas if isinstance(m, torch.Tensor)]
    names = output_names(len(tensors))
    outputs = tuple(_torch_tensor_spec(torch, n, m, model_name) for n, m in zip(names, tensors, strict=True))
    return ModelSignature(inputs=inputs, outputs=outputs)


def _torch_example_shapes(
    torch: ModuleType, program: Any, names: tuple[str, ...]
) -> dict[str, tuple[int, ...]]:
    """Shapes of the sample inputs saved with the program (used only to suggest a --input-shape)."""
    try:
        args, kwargs = program.example_inputs
        flat = [*args, *kwargs.values()]
    except Exception:  # noqa: BLE001 - programs saved without sample inputs
        return {}
    if len(flat) != len(names) or not all(isinstance(t, torch.Tensor) for t in flat):
        return {}
    return {name: tuple(int(d) for d in t.shape) for name, t in zip(names, flat, strict=True)}


def _unsupported_torch_ops(torch: ModuleType, program: Any, convert_map: Mapping[str, Any]) -> list[str]:
    """Qualified names of every call_function target (in all graphs, cond branches included) that the
    importer's convert map lacks; the importer looks targets up by ``__name__``."""
    missing: set[str] = set()
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op != "call_function":
                continue
            key = getattr(node.target, "__name__", str(node.target))
            if key not in convert_map:
                missing.add(str(node.target) if isinstance(node.target, torch._ops.OpOverload) else key)
    return sorted(missing)


def _bind_torch_shapes(
    mod: tvm.IRModule, inputs: tuple[TensorSpec, ...], shapes: Mapping[str, tuple[int, ...]]
) -> tvm.IRModule:
    """Replace the symbolic sizes of ``main``'s inputs by the given ones (BindSymbolicVars)."""
    from kiln_tvm import relax, tvm

    func = mod["main"]
    attrs = dict(func.attrs) if func.attrs is not None else {}
    lower = {str(k): int(v) for k, v in dict(attrs.get("tir_var_lower_bound", {})).items()}
    upper = {str(k): int(v) for k, v in dict(attrs.get("tir_var_upper_bound", {})).items()}
    binding: dict[Any, int] = {}
    origin: dict[str, str] = {}
    for param, spec in zip(func.params, inputs, strict=True):
        shape = shapes[spec.name]
        for i, (dim, size) in enumerate(zip(param.ty.shape.values, shape, strict=True)):
            if not isinstance(dim, tvm.tirx.Var):
                continue
            here = f"dimension {i} of input '{spec.name}'"
            if dim in binding and binding[dim] != size:
                raise InvalidSpec(
                    f"{origin[dim.name]} and {here} are the same size ('{dim.name}') in the program, but "
                    f"--input-shape gives {binding[dim]} and {size}"
                )
            lo, hi = lower.get(dim.name), upper.get(dim.name)
            if (lo is not None and size < lo) or (hi is not None and size > hi):
                bounds = f"{lo if lo is not None else 0}..{hi if hi is not None else 'inf'}"
                raise InvalidSpec(
                    f"--input-shape {spec.name}={format_shape(shape)}: {here} ('{dim.name}') must be in "
                    f"{bounds}, the range the program was exported for"
                )
            binding[dim] = size
            origin.setdefault(dim.name, here)
    if binding:
        mod = relax.transform.BindSymbolicVars(binding, "main")(mod)
        func = mod["main"]
        for key in ("tir_var_lower_bound", "tir_var_upper_bound"):
            if func.attrs is not None and key in func.attrs:
                func = func.without_attr(key)
        mod["main"] = func
    for param, spec in zip(mod["main"].params, inputs, strict=True):
        got = tuple(static_int(v) for v in param.ty.shape.values)
        if got != shapes[spec.name]:
            raise InvalidSpec(
                f"--input-shape {spec.name}={format_shape(shapes[spec.name])} does not fit the program: "
                f"with the sizes given, input '{spec.name}' has shape "
                f"{format_shape(d if d is not None else '?' for d in got)}"
            )
    return mod


def load_torch(path: Path, given: dict[str, tuple[int, ...]], max_unpacked_bytes: int) -> ImportedModel:
    torch = import_torch()
    program = load_program(torch, path, max_unpacked_bytes)
    return import_program(program, path.name, given, path)


def import_program(
    program: Any, model_name: str, given: Mapping[str, tuple[int, ...]], canonical: bytes | Path
) -> ImportedModel:
    """Import an ``ExportedProgram`` (read from a .pt2 file, or exported in this process) with every input
    shape static: the ``given`` shapes bind its symbolic sizes. ``canonical`` is the program's .pt2 bytes, or
    the file that holds them."""
    torch = import_torch()
    declared = program_signature(program, model_name)
    program = decompose_program(program, model_name)
    examples = _torch_example_shapes(torch, program, tuple(s.name for s in declared.inputs))
    shapes = resolve_input_shapes(declared.inputs, given, examples)
    mod = convert_program(program, model_name)
    check_param_count(mod, model_name, declared.inputs)
    mod = _bind_torch_shapes(mod, declared.inputs, shapes)
    outputs = output_names(len(declared.outputs))
    return imported_model(
        mod,
        model_name,
        declared=declared,
        shapes=shapes,
        output_names=outputs,
        fmt=ModelFormat.TORCH_EXPORT,
        canonical=canonical,
    )


def decompose_program(program: Any, model_name: str) -> Any:
    """The program decomposed to core ATen, what TVM's importer converts."""
    try:
        with quiet_importer("torch.export decomposition"):
            decomposed = program.run_decompositions()
    except Exception as err:  # noqa: BLE001
        raise InvalidModel(
            f"could not decompose the program in '{model_name}' to core ATen: {short_error(err)}"
        ) from None
    drop_empty_cat_operands(decomposed)
    return decomposed


def convert_program(program: Any, model_name: str) -> tvm.IRModule:
    """Relax ``main`` of a decomposed program, its weights bound as constants; every operator TVM lacks is
    named at once (:class:`UnsupportedOperator`), any other failure is an :class:`InvalidModel`. Symbolic
    sizes stay symbolic."""
    torch = import_torch()
    tvm_torch = tvm_frontends().torch_importer()
    unsupported = _unsupported_torch_ops(torch, program, tvm_frontends().torch_convert_map())
    if unsupported:
        raise UnsupportedOperator(operators=unsupported, importer="PyTorch")
    try:
        with quiet_importer("PyTorch importer"):
            return tvm_torch.from_exported_program(
                program,
                keep_params_as_input=False,
                unwrap_unit_return_tuple=True,
                run_ep_decomposition=False,  # done before, so the operator check saw what gets converted
            )
    except Exception as err:  # noqa: BLE001 - every importer failure becomes a typed error
        node = tvm_frontends().failed_torch_node(err.__traceback__)
        target = getattr(node, "target", None)
        op = str(target) if target is not None else None
        raise conversion_error(err, "PyTorch", model_name, op, getattr(node, "name", None)) from None
