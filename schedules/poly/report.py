"""What a tuned schedule's tiles hold, against the caches: the footprints of the best schedule's tiling,
cut by cut, for the API and the CLI."""

from __future__ import annotations

from typing import Any

from schedules.poly.caches import CacheHierarchy
from schedules.poly.footprint import tile_footprint_bytes
from schedules.poly.program import Program
from schedules.poly.search import traced_tilings
from schedules.poly.tiling import DEFAULT_CUT_LEVELS, cut_names, overflows, tile_below


def tiling_report(
    program: Program, trace: Any, caches: CacheHierarchy, margin: float
) -> list[dict[str, Any]]:
    """For each block the trace tiled with a multi-level tiling: its factors, and per cut (one iteration of
    the loop at that position of the structure) the bytes per tensor, the cache level the pruner holds it
    against, and whether the whole tiling lies inside the feasible set the pruner keeps."""
    reports = []
    for traced in traced_tilings(trace):
        try:
            statement = program.statement(traced.block)
        except KeyError:
            continue
        if not statement.exact or len(traced.factors) != len(statement.loops):
            continue
        tiling = traced.tiling()
        sizes = {level.name: level.bytes for level in caches.levels}
        cuts = []
        for position, name in enumerate(cut_names(traced.structure)):
            tile = tile_below(statement, tiling, position)
            per_tensor = tile_footprint_bytes(statement, tile)
            level = DEFAULT_CUT_LEVELS.get(name)
            cuts.append(
                {
                    "cut": name,
                    "tile": list(tile),
                    "bytes": per_tensor,
                    "total_bytes": sum(per_tensor.values()),
                    "cache_level": level,
                    "cache_bytes": sizes.get(level) if level else None,
                }
            )
        problems = overflows(statement, tiling, caches, margin)
        reports.append(
            {
                "statement": traced.block,
                "structure": traced.structure,
                "loops": [loop.name for loop in statement.loops],
                "factors": [list(f) for f in traced.factors],
                "cuts": cuts,
                "inside_feasible_set": not problems if caches.known else None,
                "overflows": problems,
            }
        )
    return reports
