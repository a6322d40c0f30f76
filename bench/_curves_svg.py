"""Latency over tuning time as an SVG (no plotting library): one panel per model, Kiln's latency at each
checkpoint of the cold and the warm run, and onnxruntime's latency as a flat line."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

PANEL_W, PANEL_H, MARGIN = 300, 190, 44
COLUMNS = 3
COLOURS = {"cold": "#1f77b4", "warm": "#d62728", "onnxruntime": "#555555"}


def _minutes(seconds: float) -> str:
    return "0" if seconds == 0 else f"{seconds / 60:g}m"


def _panel(result: dict[str, Any], x0: float, y0: float, checkpoints: list[float]) -> list[str]:
    ort = result["runs"]["onnxruntime"]["ms"]
    by_condition: dict[str, list[tuple[float, float]]] = {}
    for snap in result["snapshots"]:
        by_condition.setdefault(snap["condition"], []).append((snap["seconds"], snap["ms"]))
    values = [ms for points in by_condition.values() for _, ms in points] + [ort]
    top = max(values) * 1.1
    width, height = PANEL_W - MARGIN - 10, PANEL_H - MARGIN - 10
    # Checkpoints are evenly spaced (0, 1, 2, 5, 10, 30 minutes would crowd the start on a linear axis).
    slot = {s: i for i, s in enumerate(checkpoints)}

    def x(seconds: float) -> float:
        return x0 + MARGIN + width * slot[seconds] / max(1, len(checkpoints) - 1)

    def y(ms: float) -> float:
        return y0 + 10 + height * (1 - ms / top)

    out = [
        f'<text x="{x0 + MARGIN}" y="{y0 + 8}" font-size="11" font-weight="bold">'
        f"{escape(result['model']['name'])}</text>",
        f'<line x1="{x0 + MARGIN}" y1="{y(0)}" x2="{x0 + MARGIN + width}" y2="{y(0)}" stroke="#999"/>',
        f'<line x1="{x0 + MARGIN}" y1="{y(0)}" x2="{x0 + MARGIN}" y2="{y(top)}" stroke="#999"/>',
        f'<line x1="{x0 + MARGIN}" y1="{y(ort)}" x2="{x0 + MARGIN + width}" y2="{y(ort)}" '
        f'stroke="{COLOURS["onnxruntime"]}" stroke-dasharray="4 3"/>',
    ]
    for fraction in (0.5, 1.0):
        tick = top / 1.1 * fraction
        out.append(
            f'<text x="{x0 + MARGIN - 4}" y="{y(tick) + 3}" font-size="9" text-anchor="end">{tick:.3g}</text>'
        )
    for seconds in checkpoints:
        out.append(
            f'<text x="{x(seconds)}" y="{y(0) + 12}" font-size="9" text-anchor="middle">'
            f"{_minutes(seconds)}</text>"
        )
    for condition, points in by_condition.items():
        points.sort()
        path = " ".join(f"{x(s):.1f},{y(ms):.1f}" for s, ms in points)
        colour = COLOURS.get(condition, "#000")
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out += [f'<circle cx="{x(s):.1f}" cy="{y(ms):.1f}" r="2.5" fill="{colour}"/>' for s, ms in points]
    return out


def write_curves(results: list[dict[str, Any]], path: Path) -> Path:
    """Write the SVG of ``results`` (bench/time_to_fast.py's per-model results) to ``path``."""
    checkpoints = sorted({s["seconds"] for r in results for s in r["snapshots"]})
    rows = (len(results) + COLUMNS - 1) // COLUMNS
    width, height = PANEL_W * COLUMNS, PANEL_H * rows + 30
    body = []
    for index, result in enumerate(results):
        body += _panel(result, PANEL_W * (index % COLUMNS), 30 + PANEL_H * (index // COLUMNS), checkpoints)
    legend = [
        '<text x="10" y="16" font-size="11">ms over minutes of tuning:</text>',
        f'<text x="170" y="16" font-size="11" fill="{COLOURS["cold"]}">cold store</text>',
        f'<text x="240" y="16" font-size="11" fill="{COLOURS["warm"]}">warm store (other models)</text>',
        f'<text x="420" y="16" font-size="11" fill="{COLOURS["onnxruntime"]}">- - onnxruntime</text>',
    ]
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
        + "".join(legend + body)
        + "</svg>\n"
    )
    path.write_text(svg)
    return path
