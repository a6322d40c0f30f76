"""Durations on the command line: ``--time 30m`` in, ``12m05s`` out."""

from __future__ import annotations

import math

from pytimeparse import parse as parse_timespan

from tuner.errors import InvalidSpec


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``90`` (seconds), ``20s``, ``30m``, ``1h30m``, ``1.5h``; InvalidSpec otherwise."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        parsed = parse_timespan(text)
        seconds = float("nan") if parsed is None else float(parsed)
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidSpec(f"--time must be a positive duration such as 90, 20s, 30m or 1h30m, not {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """``seconds`` as ``45s``, ``12m05s`` or ``1h02m``."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
