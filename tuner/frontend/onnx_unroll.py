"""ONNX ``Scan`` and ``Loop`` nodes of a static trip count, unrolled into plain nodes before conversion.

TVM's ONNX importer converts neither. Once a model's input shapes are fixed and its constants folded, a
``Scan`` always has a static length (the extent of its scanned axis), and a ``Loop`` exported from a
``for`` loop over a shape has a constant trip count and a condition it only passes along. Both are then the
same computation written out: each iteration's body inlined under names of its own, the loop-carried values
threaded from one iteration to the next, the per-iteration outputs stacked.

A ``Loop`` is unrolled when its trip count is a constant (at most :data:`MAX_ITERATIONS`), its condition
input is absent or a constant true, and its body passes the condition through unchanged (an ``Identity``
of the condition input, as exporters write a ``for`` loop). Anything else is left to the importer, which
names it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

#: The most iterations written out per node: an unrolled body is a copy per iteration.
MAX_ITERATIONS = 256


def unroll_loops(model: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]]) -> int:
    """Unroll, in place, the main graph's ``Scan`` and ``Loop`` nodes that can be (see the module), for
    the static ``input_shapes``; return how many were."""
    from onnx import numpy_helper

    graph = model.graph
    if not any(n.op_type in ("Scan", "Loop") for n in graph.node):
        return 0
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    shapes = _static_shapes(model, input_shapes)
    unrolled, nodes = 0, []
    for index, node in enumerate(graph.node):
        writer = _Writer(graph, f"{node.name or node.op_type}_{index}")
        done = False
        if node.op_type == "Scan" and node.domain in ("", "ai.onnx"):
            done = _unroll_scan(node, writer, shapes)
        elif node.op_type == "Loop" and node.domain in ("", "ai.onnx"):
            done = _unroll_loop(node, writer, constants)
        if done:
            nodes.extend(writer.nodes)
            unrolled += 1
        else:
            nodes.append(node)
    if unrolled:
        del graph.node[:]
        graph.node.extend(nodes)
    return unrolled


class _Writer:
    """New nodes and initializers under one prefix (unique per rewritten node)."""

    def __init__(self, graph: onnx.GraphProto, prefix: str) -> None:
        self.graph, self.prefix, self.nodes = graph, prefix, []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}__{hint}_{self._count}"

    def node(
        self, op: str, inputs: list[str], outputs: list[str] | None = None, **attrs: object
    ) -> list[str]:
        from onnx import helper

        outputs = outputs or [self.name(op.lower())]
        self.nodes.append(helper.make_node(op, inputs, outputs, **attrs))
        return outputs

    def const(self, value: object, dtype: str = "int64") -> str:
        import numpy as np
        from onnx import numpy_helper

        name = self.name("const")
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def inline(self, body: onnx.GraphProto, bound: dict[str, str], iteration: int) -> list[str]:
        """Copy ``body``'s nodes with its inputs bound to ``bound`` and its own values renamed for this
        iteration (names from outside the body are kept); return the names of its outputs."""
        from onnx import helper

        renamed = dict(bound)
        for init in body.initializer:
            copy = type(init)()
            copy.CopyFrom(init)
            copy.name = renamed[init.name] = f"{self.prefix}__it{iteration}__{init.name}"
            self.graph.initializer.append(copy)
        for node in body.node:
            for out in node.output:
                if out:
                    renamed[out] = f"{self.prefix}__it{iteration}__{out}"
        for node in body.node:
            copy = helper.make_node("Identity", [], [])
            copy.CopyFrom(node)
            del copy.input[:]
            copy.input.extend(renamed.get(name, name) if name else "" for name in node.input)
            del copy.output[:]
            copy.output.extend(renamed.get(name, name) if name else "" for name in node.output)
            copy.name = f"{self.prefix}__it{iteration}__{node.name}" if node.name else ""
            self.nodes.append(copy)
        return [renamed.get(out.name, out.name) for out in body.output]


def _static_shapes(model: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]]) -> dict[str, list[int]]:
    """Every value's static shape ONNX's shape inference finds for the ``input_shapes`` (on the model
    without its weights: inference serializes what it reads)."""
    import onnx

    from tuner.frontend.onnx_simplify import skeleton

    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton(model, input_shapes)[0], data_prop=True)
    except Exception:  # noqa: BLE001 - inference is best effort: without a shape, a Scan is left alone
        inferred = model
    shapes = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[value.name] = [int(d.dim_value) for d in tensor.shape.dim]
    for init in model.graph.initializer:
        shapes[init.name] = [int(d) for d in init.dims]
    return shapes


def _nests_graphs(body: onnx.GraphProto) -> bool:
    """Whether a body has nodes with graphs of their own (their names are not renamed when inlined)."""
    return any(a.HasField("g") or len(a.graphs) for n in body.node for a in n.attribute)


def _attr(node: onnx.NodeProto, name: str, default: object = None) -> object:
    from onnx import helper

    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _unroll_scan(node: onnx.NodeProto, w: _Writer, shapes: dict[str, list[int]]) -> bool:
    body = _attr(node, "body")
    if body is None or _nests_graphs(body):
        return False
    scans = int(_attr(node, "num_scan_inputs", 0))
    states = len(node.input) - scans
    scan_inputs = list(node.input[states:])
    if body is None or not scans or any(name not in shapes for name in scan_inputs):
        return False
    in_axes = list(_attr(node, "scan_input_axes", [0] * scans))
    in_dirs = list(_attr(node, "scan_input_directions", [0] * scans))
    outputs = len(body.output) - states
    out_axes = list(_attr(node, "scan_output_axes", [0] * outputs))
    out_dirs = list(_attr(node, "scan_output_directions", [0] * outputs))
    lengths = {
        shapes[name][axis % len(shapes[name])] for name, axis in zip(scan_inputs, in_axes, strict=True)
    }
    if len(lengths) != 1 or next(iter(lengths)) > MAX_ITERATIONS:
        return False
    length = lengths.pop()
    carried = list(node.input[:states])
    produced: list[list[str]] = [[] for _ in range(outputs)]
    for t in range(length):
        elements = []
        for name, axis, direction in zip(scan_inputs, in_axes, in_dirs, strict=True):
            step = length - 1 - t if direction else t
            elements.append(w.node("Gather", [name, w.const(step)], axis=int(axis))[0])
        bound = dict(zip([v.name for v in body.input], carried + elements, strict=True))
        results = w.inline(body, bound, t)
        carried = results[:states]
        for k in range(outputs):
            produced[k].append(results[states + k])
    for k, out in enumerate(node.output):
        if k < states:
            w.node("Identity", [carried[k]], [out])
            continue
        j = k - states
        if not out:
            continue
        axis = int(out_axes[j])
        steps = produced[j][::-1] if out_dirs[j] else produced[j]
        expanded = [w.node("Unsqueeze", [s, w.const([axis])])[0] for s in steps]
        w.node("Concat", expanded, [out], axis=axis)
    return True


def _unroll_loop(node: onnx.NodeProto, w: _Writer, constants: dict[str, object]) -> bool:
    import numpy as np

    body = _attr(node, "body")
    if body is None or _nests_graphs(body):
        return False
    trip_name = node.input[0] if node.input else ""
    cond_name = node.input[1] if len(node.input) > 1 else ""
    if body is None or not trip_name or trip_name not in constants:
        return False
    if cond_name and not (cond_name in constants and bool(np.asarray(constants[cond_name]).all())):
        return False
    cond_in, cond_out = body.input[1].name, body.output[0].name
    passes_condition = any(
        n.op_type == "Identity" and list(n.input) == [cond_in] and list(n.output) == [cond_out]
        for n in body.node
    )
    trips = int(np.asarray(constants[trip_name]).reshape(-1)[0])
    if not passes_condition or trips > MAX_ITERATIONS or trips < 1:
        return False
    carried = list(node.input[2:])
    states = len(carried)
    produced: list[list[str]] = [[] for _ in range(len(body.output) - 1 - states)]
    true = w.const(True, dtype="bool")
    for t in range(trips):
        bound = dict(zip([v.name for v in body.input], [w.const(t), true, *carried], strict=True))
        results = w.inline(body, bound, t)
        carried = results[1 : 1 + states]
        for k, name in enumerate(results[1 + states :]):
            produced[k].append(name)
    for k, out in enumerate(node.output):
        if not out:
            continue
        if k < states:
            w.node("Identity", [carried[k]], [out])
        else:
            expanded = [w.node("Unsqueeze", [s, w.const([0])])[0] for s in produced[k - states]]
            w.node("Concat", expanded, [out], axis=0)
    return True
