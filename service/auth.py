"""Bearer-token authentication. A token's name owns the models and jobs created with it.

Tokens come from ``KILN_API_TOKENS`` (``name:token`` pairs) and from ``kiln token create NAME`` (only
their sha256 is stored). With none configured, the API is open and everything belongs to owner ``""``.
"""

from __future__ import annotations

import hmac
import threading
import time

from tuner.errors import Unauthorized
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.tokens import parse_tokens, token_sha256

# How long the answer to "are tokens stored in the database?" is trusted before asking again.
_TOKENS_CHECK_S = 5.0


class Authenticator:
    """Turns an ``Authorization`` header into the owner name the request acts as."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.env_tokens = parse_tokens(settings.api_tokens)
        self.store = store
        self._lock = threading.Lock()
        self._stored: tuple[float, bool] = (0.0, False)

    def enabled(self) -> bool:
        """Whether requests must carry a token."""
        if self.env_tokens:
            return True
        with self._lock:
            checked_at, stored = self._stored
            if time.monotonic() - checked_at < _TOKENS_CHECK_S:
                return stored
        stored = self.store.has_tokens()
        with self._lock:
            self._stored = (time.monotonic(), stored)
        return stored

    def owner(self, authorization: str | None) -> str:
        """The owner of the request; :class:`Unauthorized` when a token is needed and missing or wrong."""
        if not self.enabled():
            return ""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("this Kiln server requires an API token: send 'Authorization: Bearer <token>'")
        digest = token_sha256(token.strip())
        for known, name in self.env_tokens.items():
            if hmac.compare_digest(known, digest):
                return name
        name = self.store.token_owner(digest)
        if name is None:
            raise Unauthorized("the API token is not valid (revoked, or mistyped)")
        return name
