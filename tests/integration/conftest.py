"""Fixtures of the integration tests."""

from __future__ import annotations

import pytest

from tuner.settings import Settings
from tuner.store import Store


@pytest.fixture
def sqlite_store(settings: Settings) -> Store:
    """The ``settings`` fixture's own SQLite store, for tests that run jobs with those settings (the
    store's behaviour on PostgreSQL is tested by the tests that take ``store``)."""
    store = Store.from_settings(settings)
    store.ensure_schema()
    return store
