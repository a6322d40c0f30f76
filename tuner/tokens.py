"""API tokens: how they are made, written in ``KILN_API_TOKENS``, and kept (only their sha256)."""

from __future__ import annotations

import hashlib
import secrets

from tuner.errors import InvalidSpec


def token_sha256(token: str) -> str:
    """What the database keeps of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random bearer token."""
    return "kiln_" + secrets.token_urlsafe(32)


def parse_tokens(value: str | None) -> dict[str, str]:
    """``KILN_API_TOKENS`` (``name:token`` entries, comma-separated) as {sha256: name}.

    A bare token (no ``name:``) is named after the start of its hash.
    """
    tokens: dict[str, str] = {}
    for entry in (value or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, token = entry.partition(":")
        if not sep:
            name, token = "", name
        if not token:
            raise InvalidSpec(f"empty token in KILN_API_TOKENS entry {entry!r}; use name:token")
        digest = token_sha256(token)
        tokens[digest] = name.strip() or f"token-{digest[:8]}"
    return tokens
