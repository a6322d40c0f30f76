"""The options of ``torch.compile(backend="kiln")``: defaults from ``KILN_*``, overrides, clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.capture.options import OPTIONS, capture_options
from tuner.errors import InvalidSpec
from tuner.settings import Settings


def test_defaults_come_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CAPTURE_TUNE", "queue")
    monkeypatch.setenv("KILN_CAPTURE_FREEZE", "true")
    opts = capture_options(None, Settings())
    assert opts.tune == "queue" and opts.freeze is True and opts.target == "host"
    assert opts.strict is False and opts.trials is None and opts.owner == ""


def test_options_override_the_settings(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "a", database_url=None, capture_tune="queue")
    opts = capture_options({"tune": 32, "freeze": True, "data_dir": str(tmp_path / "b")}, settings)
    assert opts.tune == 32 and opts.freeze is True
    assert opts.settings.data_dir == tmp_path / "b"
    assert opts.settings.resolved_database_url.endswith("b/kiln.db")
    assert capture_options({"tune": "12"}, settings).tune == 12
    assert capture_options({"tune": 0}, settings).tune == "off"


def test_an_unknown_option_lists_the_known_ones() -> None:
    with pytest.raises(InvalidSpec) as info:
        capture_options({"frozen": True})
    assert "frozen" in info.value.message
    assert all(name in info.value.message for name in OPTIONS)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"tune": "later"}, "'tune'"),
        ({"tune": True}, "'tune'"),
        ({"tune": -4}, "positive"),
        ({"freeze": "yes"}, "'freeze'"),
        ({"trials": 0}, "'trials'"),
        ({"time_budget_s": -1}, "'time_budget_s'"),
        ({"target": 3}, "'target'"),
    ],
)
def test_ill_typed_options_are_refused(options: dict, match: str) -> None:
    with pytest.raises(InvalidSpec, match=match):
        capture_options(options)


def test_the_tune_setting_is_validated() -> None:
    with pytest.raises(ValueError, match="capture_tune"):
        Settings(capture_tune="sometimes")
