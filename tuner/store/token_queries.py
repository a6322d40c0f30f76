"""API tokens: names and hashes (the tokens themselves are never stored)."""

from __future__ import annotations

import sqlalchemy as sa

from tuner.entities import ApiToken
from tuner.errors import NotFound
from tuner.store.base import StoreBase, rowcount
from tuner.store.orm import ApiTokenRow


class TokenQueries(StoreBase):
    """API tokens."""

    def add_token(self, name: str, token_sha256: str) -> None:
        """Store a token's hash under ``name`` (who owns what it creates); :class:`Conflict` if taken."""
        with self.session_scope(conflict=f"a token named '{name}' already exists") as s:
            s.add(ApiTokenRow(name=name, token_sha256=token_sha256))

    def token_owner(self, token_sha256: str) -> str | None:
        """The name a token belongs to, or None for an unknown token."""
        with self.session_scope(write=False) as s:
            return s.scalar(sa.select(ApiTokenRow.name).where(ApiTokenRow.token_sha256 == token_sha256))

    def list_tokens(self) -> list[ApiToken]:
        """Every stored token."""
        with self.session_scope(write=False) as s:
            return [
                ApiToken(n, at) for n, at in s.execute(sa.select(ApiTokenRow.name, ApiTokenRow.created_at))
            ]

    def has_tokens(self) -> bool:
        """Whether any token is stored (the API then requires one)."""
        with self.session_scope(write=False) as s:
            return s.scalar(sa.select(sa.func.count(ApiTokenRow.id))) > 0

    def delete_token(self, name: str) -> None:
        """Revoke the token called ``name``."""
        with self.session_scope() as s:
            result = s.execute(sa.delete(ApiTokenRow).where(ApiTokenRow.name == name))
            if rowcount(result) == 0:
                raise NotFound(f"no token named '{name}'")
