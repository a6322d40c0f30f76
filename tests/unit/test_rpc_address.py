"""Parsing RPC tracker addresses (no tracker needed)."""

from __future__ import annotations

import pytest

from tuner.errors import InvalidSpec
from tuner.rpc.address import parse_tracker


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9190", ("127.0.0.1", 9190)),
        (" tracker.lan:80 ", ("tracker.lan", 80)),
        ("[::1]:9190", ("::1", 9190)),
    ],
)
def test_parse_tracker(address: str, expected: tuple[str, int]) -> None:
    assert parse_tracker(address) == expected


@pytest.mark.parametrize("address", ["", "localhost", ":9190", "localhost:", "localhost:0", "h:70000", "h:x"])
def test_parse_tracker_rejects_bad_addresses(address: str) -> None:
    with pytest.raises(InvalidSpec, match="host:port"):
        parse_tracker(address)
