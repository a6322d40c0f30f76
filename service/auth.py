"""Bearer-token authentication. A token's name owns the models and jobs created with it.

Tokens come from ``KILN_API_TOKENS`` (``name:token`` pairs) and from ``kiln token create NAME`` (only
their sha256 is stored). Whether requests need one is decided once, when the server starts
(:func:`auth_required`), and never changes while it runs: revoking the last token leaves a server that
refuses everyone, not one that lets everyone in. Without auth everything belongs to owner ``""``.

:class:`AuthGate` checks every ``/api`` request from its headers, before any of its body is read, so an
unauthenticated upload costs the server nothing.
"""

from __future__ import annotations

import hmac
import ipaddress

from anyio import to_thread
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import error_response
from tuner.errors import Unauthorized
from tuner.settings import Settings
from tuner.store.sql import Store
from tuner.tokens import parse_tokens, token_sha256

#: Where :class:`AuthGate` leaves the owner of an authenticated request (``request.state``).
OWNER_STATE = "kiln_owner"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name to bind) is reachable from this machine only."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def auth_required(settings: Settings, store: Store) -> bool:
    """``KILN_AUTH`` when set; otherwise required when any token exists or the server binds beyond loopback."""
    if settings.auth is not None:
        return settings.auth == "required"
    return bool(parse_tokens(settings.api_tokens)) or store.has_tokens() or not is_loopback(settings.host)


class Authenticator:
    """Turns an ``Authorization`` header into the owner name the request acts as."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.env_tokens = parse_tokens(settings.api_tokens)
        self.store = store
        # Whether requests must carry a token: fixed for the life of the server.
        self.required = auth_required(settings, store)

    def owner(self, authorization: str | None) -> str:
        """The owner of the request; :class:`Unauthorized` when a token is needed and missing or wrong."""
        if not self.required:
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


#: What a token guards: the API, and the metrics (their counts cover every user's jobs). /healthz, the
#: dashboard's files and /docs stay open.
GUARDED_PREFIXES = ("/api/", "/metrics")


class AuthGate:
    """ASGI middleware: answer 401 to an ``/api`` (or ``/metrics``) request without a valid token before
    reading its body."""

    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not self.auth.required
            or not scope["path"].startswith(GUARDED_PREFIXES)
        ):
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"authorization")
        try:
            owner = await to_thread.run_sync(self.auth.owner, header.decode("latin-1") if header else None)
        except Unauthorized as exc:
            await error_response(exc.kind, exc.message, 401)(scope, receive, send)
            return
        scope.setdefault("state", {})[OWNER_STATE] = owner
        await self.app(scope, receive, send)
