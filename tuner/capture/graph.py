"""A graph TorchDynamo captured, as a ``torch.export`` program Kiln imports like a .pt2 file.

Dynamo hands a backend an FX ``GraphModule`` whose placeholders are the region's inputs, the module's
parameters and buffers (lifted to inputs), and, with symbolic shapes, the sizes of its inputs as integers.
:func:`describe_placeholders` tells them apart; :func:`export_captured` wraps the graph in a module that
takes only what must be fed at each call (the region's inputs; the weights too unless frozen), computes
the sizes from the inputs, and holds frozen weights as buffers, so that ``torch.export`` makes them
constants of the program and Kiln's weight pre-packing applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Feed(str, Enum):
    """What a placeholder of a captured graph is."""

    INPUT = "input"  # a tensor the region is called with
    WEIGHT = "weight"  # a parameter or buffer of a module
    SIZE = "size"  # a symbolic size of an input tensor (dynamic shapes)


@dataclass(frozen=True)
class Placeholder:
    name: str
    feed: Feed
    #: For a size: the placeholder index of the tensor it is a size of, and the dimension.
    size_of: tuple[int, int] | None = None


class NotCapturable(Exception):
    """A captured graph Kiln does not compile (it runs eagerly instead); the message says why."""


def describe_placeholders(gm: Any, example_inputs: Sequence[Any]) -> list[Placeholder]:
    """Each placeholder of ``gm`` with what it is, read from Dynamo's record of its source."""
    import torch

    nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(nodes) != len(example_inputs):
        raise NotCapturable(f"the graph has {len(nodes)} placeholders but {len(example_inputs)} inputs")
    source_index = {_source_name(n): i for i, n in enumerate(nodes) if _source_name(n) is not None}
    found: list[Placeholder] = []
    for node, value in zip(nodes, example_inputs, strict=True):
        source = _source(node)
        if isinstance(value, torch.SymInt | int) and not isinstance(value, bool):
            base = getattr(source, "base", None)
            prop = getattr(getattr(source, "prop", None), "name", None)
            tensor = source_index.get(_name(base)) if base is not None else None
            if prop != "SIZE" or tensor is None:
                raise NotCapturable(
                    f"input '{node.name}' is an integer that is not a size of an input tensor"
                )
            found.append(Placeholder(node.name, Feed.SIZE, (tensor, int(source.idx))))
        elif isinstance(value, torch.Tensor):
            weight = isinstance(value, torch.nn.Parameter) or _is_module_state(source)
            found.append(Placeholder(node.name, Feed.WEIGHT if weight else Feed.INPUT))
        else:
            raise NotCapturable(f"input '{node.name}' is a {type(value).__name__}, not a tensor")
    return found


def _source(node: Any) -> Any:
    grapharg = node.meta.get("grapharg")
    return getattr(grapharg, "source", None)


def _source_name(node: Any) -> str | None:
    source = _source(node)
    return _name(source) if source is not None else None


def _name(source: Any) -> str | None:
    """A Dynamo source's name (a method in some of its classes, a property in others)."""
    name = getattr(source, "name", None)
    try:
        return str(name()) if callable(name) else (str(name) if name is not None else None)
    except Exception:  # noqa: BLE001 - a source kind without a name
        return None


def _is_module_state(source: Any) -> bool:
    """Whether a placeholder's source is a module's parameter or buffer (``..._buffers['running_mean']``)."""
    while source is not None:
        if "ParamBufferSource" in type(source).__name__:
            return True
        source = getattr(source, "base", None)
    return False


@dataclass
class ExportedCapture:
    """A captured graph exported: the program, which placeholders each call feeds it, and the weights
    frozen into it."""

    program: Any  # torch.export.ExportedProgram
    placeholders: list[Placeholder]
    fed: list[int]  # placeholder indices the compiled function takes, in order
    frozen: bool
    dynamic: bool


def export_captured(
    gm: Any, example_inputs: Sequence[Any], placeholders: list[Placeholder], freeze: bool, dynamic: bool
) -> ExportedCapture:
    """``torch.export`` of the captured graph, fed with its inputs (and its weights unless ``freeze``).

    With ``dynamic``, the inputs' symbolic dimensions stay symbolic (``Dim.DYNAMIC``); otherwise the
    program is specialised to the example shapes.
    """
    import torch

    fed = [
        i
        for i, p in enumerate(placeholders)
        if p.feed is Feed.INPUT or (p.feed is Feed.WEIGHT and not freeze)
    ]
    module = _Exportable(gm, placeholders, fed, example_inputs, freeze)
    args = tuple(_concrete(example_inputs[i]) for i in fed)
    shapes = _dynamic_shapes(placeholders, fed, example_inputs) if dynamic else None
    try:
        # Outside Dynamo's tracing context: its shape environment names Dynamo's sources (``L['x']``),
        # which export would turn into guards that cannot be evaluated.
        with torch._guards.tracing(None):
            program = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
    except Exception as err:  # noqa: BLE001 - whatever torch.export refuses is run eagerly
        text = str(err).strip().splitlines()
        raise NotCapturable(
            f"torch.export failed on the captured graph: {text[0] if text else err!r}"
        ) from None
    return ExportedCapture(program, placeholders, fed, freeze, dynamic)


def _concrete(value: Any) -> Any:
    return value.detach() if hasattr(value, "detach") else value


def _dynamic_shapes(placeholders: list[Placeholder], fed: list[int], example_inputs: Sequence[Any]) -> Any:
    """``Dim.DYNAMIC`` for every dimension some size placeholder stands for (the rest static)."""
    import torch

    dynamic_dims: dict[int, set[int]] = {}
    for p in placeholders:
        if p.size_of is not None:
            dynamic_dims.setdefault(p.size_of[0], set()).add(p.size_of[1])
    # One entry: the wrapper's ``forward(*tensors)`` takes the fed tensors as one varargs tuple.
    return (
        tuple({d: torch.export.Dim.DYNAMIC for d in sorted(dynamic_dims.get(i, ()))} or None for i in fed),
    )


def _exportable_class() -> type:
    import torch

    class Exportable(torch.nn.Module):
        """Calls the captured graph with the fed tensors, the frozen weights and the sizes of the inputs."""

        def __init__(
            self,
            gm: Any,
            placeholders: list[Placeholder],
            fed: list[int],
            example_inputs: Sequence[Any],
            freeze: bool,
        ) -> None:
            super().__init__()
            self.gm = gm
            self.placeholders = placeholders
            self.fed = fed
            self.frozen: dict[int, str] = {}
            for i, p in enumerate(placeholders):
                if p.feed is Feed.WEIGHT and freeze:
                    name = f"w{i}_{p.name}"[:120]
                    self.register_buffer(name, example_inputs[i].detach())
                    self.frozen[i] = name

        def forward(self, *tensors: Any) -> Any:
            values: list[Any] = [None] * len(self.placeholders)
            for i, t in zip(self.fed, tensors, strict=True):
                values[i] = t
            for i, name in self.frozen.items():
                values[i] = getattr(self, name)
            for i, p in enumerate(self.placeholders):
                if p.size_of is not None:
                    tensor, dim = p.size_of
                    values[i] = values[tensor].size(dim)
            return self.gm(*values)

    return Exportable


def _Exportable(  # noqa: N802 - reads as the class it builds
    gm: Any, placeholders: list[Placeholder], fed: list[int], example_inputs: Sequence[Any], freeze: bool
) -> Any:
    return _exportable_class()(gm, placeholders, fed, example_inputs, freeze)
