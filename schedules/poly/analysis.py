"""The polyhedral analysis of one kernel, as the API, the CLI and the search use it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedules.poly.caches import CacheHierarchy
from schedules.poly.dependences import Dependence, compute_dependences
from schedules.poly.extract import extract_program
from schedules.poly.footprint import reuse_directions
from schedules.poly.isl_model import IslProgram
from schedules.poly.legality import Fusion, LoopLegality, fusion_depths, loop_legality
from schedules.poly.program import LoopKind, Program, Statement


@dataclass(frozen=True)
class PolyhedralAnalysis:
    program: Program
    domain: str
    accesses: list[dict[str, Any]]
    dependences: list[Dependence]
    loops: list[LoopLegality]
    fusions: list[Fusion]
    caches: CacheHierarchy

    @property
    def exact(self) -> bool:
        return self.program.exact

    def summary(self, statement: Statement) -> str:
        """What carries ``statement``'s dependences on itself, in a sentence."""
        own = [d for d in self.dependences if d.source == statement.name and d.sink == statement.name]
        carriers = list(dict.fromkeys(loop for d in own for loop in d.carried_by))
        if not carriers:
            return "no dependence is carried by a loop: every loop is parallel"
        kinds = {loop.name: loop.kind for loop in statement.loops}
        if all(kinds[c] is LoopKind.REDUCTION for c in carriers):
            return (
                f"carried only by the reduction loop{'s' if len(carriers) > 1 else ''} {', '.join(carriers)}"
            )
        return "carried by " + ", ".join(f"{c} ({kinds[c].value})" for c in carriers)

    def to_json(self) -> dict[str, Any]:
        return {
            "exact": self.exact,
            "inexact": list(self.program.inexact),
            "fallback": (
                None
                if self.exact
                else "parts of this kernel are not affine: the polyhedral hooks leave them to the stock space"
            ),
            "domain": self.domain,
            "statements": [
                {
                    "name": s.name,
                    "isl_name": f"S{index}",
                    "loops": [
                        {"name": loop.name, "extent": loop.extent, "kind": loop.kind.value}
                        for loop in s.loops
                    ],
                    "dependence_summary": self.summary(s),
                    "exact": s.exact,
                }
                for index, s in enumerate(self.program.statements)
            ],
            "accesses": self.accesses,
            "dependences": [
                {
                    "kind": d.kind.value,
                    "source": d.source,
                    "sink": d.sink,
                    "tensor": d.tensor,
                    "common_loops": list(d.common_loops),
                    "distance": d.distance_text if d.common_loops else None,
                    "carried_by": list(d.carried_by),
                    "relation": d.relation,
                }
                for d in self.dependences
            ],
            "loops": [
                {
                    "statement": loop.statement,
                    "loop": loop.loop,
                    "extent": loop.extent,
                    "kind": loop.kind.value,
                    "parallel": loop.parallel,
                    "band": loop.band,
                    "permutable": loop.permutable,
                    "reduction": loop.reduction,
                    "vectorizable": loop.vectorizable,
                    "carries": list(loop.carries),
                }
                for loop in self.loops
            ],
            "fusion": [
                {
                    "producer": f.producer,
                    "consumer": f.consumer,
                    "tensor": f.tensor,
                    "depth": f.depth,
                    "shared_loops": list(f.shared_loops),
                }
                for f in self.fusions
            ],
            "caches": self.caches.to_json(),
        }


def analyse_program(program: Program, caches: CacheHierarchy) -> PolyhedralAnalysis:
    """Dependences, legality and fusion depths of an extracted program."""
    ip = IslProgram(program)
    deps = compute_dependences(ip)
    accesses = []
    for s in ip.statements:
        for access in s.statement.accesses:
            accesses.append(
                {
                    "statement": s.statement.name,
                    "tensor": access.tensor.name,
                    "kind": access.kind.value,
                    "shape": list(access.tensor.shape),
                    "relation": str(s.access(access)),
                    "exact": access.exact,
                    "clamped": access.clamped,
                    "reason": access.reason,
                    "reuse": [list(v) for v in reuse_directions(s.statement, access)],
                }
            )
    return PolyhedralAnalysis(
        program=program,
        domain=ip.domain_text(),
        accesses=accesses,
        dependences=[d.dependence for d in deps],
        loops=loop_legality(ip, deps),
        fusions=fusion_depths(ip, deps),
        caches=caches,
    )


def analyse_prim_func(func: Any, caches: CacheHierarchy, name: str = "main") -> PolyhedralAnalysis:
    """The polyhedral analysis of a task's PrimFunc (unscheduled, after legalization and fusion)."""
    return analyse_program(extract_program(func, name), caches)


__all__ = [
    "PolyhedralAnalysis",
    "analyse_prim_func",
    "analyse_program",
]
