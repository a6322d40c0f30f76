"""``--time`` durations: parsed from what a user types, shown back compactly."""

from __future__ import annotations

import pytest

from cli.durations import format_duration, parse_duration
from tuner.errors import InvalidSpec


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("20s", 20.0), ("30m", 1800.0), ("1h30m", 5400.0), ("1.5h", 5400.0), (" 2.5 ", 2.5)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "0", "-5m", "0s", "inf", "nan"])
def test_parse_duration_refuses_what_is_not_a_positive_duration(text: str) -> None:
    with pytest.raises(InvalidSpec, match="--time must be a positive duration"):
        parse_duration(text)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 44.6, 60, 725, 3725)] == ["0s", "45s", "1m00s", "12m05s", "1h02m"]
