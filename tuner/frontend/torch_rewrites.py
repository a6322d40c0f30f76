"""Rewrites of a decomposed ``torch.export`` program before TVM's importer sees it, for ATen semantics the
importer does not model."""

from __future__ import annotations

from typing import Any


def _is_legacy_empty(node: Any) -> bool:
    """Whether ``node`` is a 1-D tensor of size 0: what ``aten.cat`` skips whatever the other operands'
    rank (PyTorch's legacy rule, on which transformers' key-value caches rely: an empty cache is
    ``torch.tensor([])``)."""
    value = getattr(node, "meta", {}).get("val")
    shape = getattr(value, "shape", None)
    return shape is not None and len(shape) == 1 and isinstance(shape[0], int) and shape[0] == 0


def drop_empty_cat_operands(program: Any) -> int:
    """Leave out of every ``aten.cat`` the 1-D empty operands PyTorch skips (TVM's concat requires one
    rank), in place; a cat left with one operand becomes that operand. Returns how many were dropped."""
    import torch

    graph = program.graph_module.graph
    dropped = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
            continue
        operands = list(node.args[0])
        kept = [x for x in operands if not _is_legacy_empty(x)]
        if len(kept) == len(operands) or not kept:
            continue
        dropped += len(operands) - len(kept)
        if len(kept) == 1:
            node.replace_all_uses_with(kept[0])
            graph.erase_node(node)
        else:
            node.args = (kept, *node.args[1:])
    if dropped:
        graph.eliminate_dead_code()
        program.graph_module.recompile()
    return dropped
