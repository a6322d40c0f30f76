"""Input shapes: the ``--input-shape`` syntax, and the concrete shape of every input of a model."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from tuner.entities import Dim, TensorSpec
from tuner.errors import InvalidSpec, MissingInputShape

#: Shape of a tensor whose rank the model does not declare.
UNKNOWN_RANK: tuple[Dim, ...] = ("...",)


def parse_input_shapes(items: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``--input-shape`` values such as ``x=1x3x224x224`` (``,`` also separates dimensions)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for raw in items:
        item = raw.strip()
        name, sep, dims_text = item.rpartition("=")
        name = name.strip()
        if not sep or not name:
            raise InvalidSpec(
                f"bad --input-shape {raw!r}: expected NAME=DIMS, e.g. --input-shape x=1x3x224x224"
            )
        parts = [p.strip() for p in re.split(r"[xX,]", dims_text)]
        if not dims_text.strip():
            raise InvalidSpec(f"bad --input-shape {raw!r}: no dimensions after '='; e.g. {name}=1x3x224x224")
        dims: list[int] = []
        for part in parts:
            if not part.isdigit() or int(part) < 1:
                raise InvalidSpec(
                    f"bad --input-shape {raw!r}: dimension {part!r} is not a positive integer; "
                    f"e.g. {name}=1x3x224x224"
                )
            dims.append(int(part))
        if name in shapes:
            raise InvalidSpec(f"--input-shape is given twice for input '{name}'")
        shapes[name] = tuple(dims)
    return shapes


def format_shape(shape: Iterable[Dim]) -> str:
    return "x".join(str(d) for d in shape)


def resolve_input_shapes(
    inputs: tuple[TensorSpec, ...],
    given: Mapping[str, tuple[int, ...]],
    examples: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for all inputs: the declared static ones, or the user's for dynamic ones."""
    names = [spec.name for spec in inputs]
    unknown = [name for name in given if name not in names]
    if unknown:
        listed = ", ".join(f"'{n}'" for n in unknown)
        have = ", ".join(f"'{n}'" for n in names) or "none"
        noun = "is not an input" if len(unknown) == 1 else "are not inputs"
        raise InvalidSpec(f"--input-shape {listed} {noun} of the model; its inputs are: {have}")

    shapes: dict[str, tuple[int, ...]] = {}
    missing: list[str] = []
    suggestions: list[str] = []
    for spec in inputs:
        declared = spec.shape
        if spec.name in given:
            shapes[spec.name] = check_given_shape(spec, given[spec.name])
            continue
        if declared != UNKNOWN_RANK and spec.is_static:
            shapes[spec.name] = tuple(int(d) for d in declared)
            continue
        if declared == UNKNOWN_RANK:
            missing.append(f"input '{spec.name}' has an unknown rank")
            example: tuple[Dim, ...] = (examples or {}).get(spec.name) or (1,)
        else:
            dyn = [(i, d) for i, d in enumerate(declared) if not isinstance(d, int)]
            listed = ", ".join(f"{i} ('{d}')" for i, d in dyn)
            noun = "a dynamic dimension" if len(dyn) == 1 else "dynamic dimensions"
            missing.append(f"input '{spec.name}' has {noun} {listed}")
            example = (examples or {}).get(spec.name) or tuple(
                d if isinstance(d, int) else 1 for d in declared
            )
        suggestions.append(f"--input-shape {spec.name}={format_shape(example)}")
    if missing:
        which = "its shape" if len(missing) == 1 else "their shapes"
        raise MissingInputShape(f"{'; '.join(missing)}; give {which}, e.g. {' '.join(suggestions)}")
    return shapes


def check_given_shape(spec: TensorSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` for the input ``spec`` declares, checked (rank, fixed dimensions); InvalidSpec otherwise."""
    flag = f"--input-shape {spec.name}={format_shape(shape)}"
    declared_empty = {i for i, d in enumerate(spec.shape) if d == 0} if spec.shape != UNKNOWN_RANK else set()
    if any(d < 1 and not (d == 0 and i in declared_empty) for i, d in enumerate(shape)):
        raise InvalidSpec(f"{flag}: every dimension must be a positive integer")
    if spec.shape == UNKNOWN_RANK:
        return shape
    if len(shape) != len(spec.shape):
        raise InvalidSpec(
            f"{flag} has {len(shape)} dimensions, but input '{spec.name}' has rank {len(spec.shape)} "
            f"(declared shape {format_shape(spec.shape)})"
        )
    for i, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
        if isinstance(want, int) and want != got:
            raise InvalidSpec(
                f"{flag}: dimension {i} of input '{spec.name}' is fixed to {want} by the model, "
                f"not {got} (declared shape {format_shape(spec.shape)})"
            )
    return shape
