"""Who may call the REST API."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple


class ApiToken(NamedTuple):
    """A stored API token, by name (only the token's hash is kept)."""

    name: str
    created_at: datetime
