"""The contract of API tokens: only their hashes are stored."""

from __future__ import annotations

import abc

from db.types import ApiToken


class TokenStorage(abc.ABC):
    """API tokens (hashes, kinds, revocation)."""

    @abc.abstractmethod
    def add_api_token(self, *, name: str, token_hash: str, kind: str) -> ApiToken:
        """Store a token's hash (never the token)."""

    @abc.abstractmethod
    def find_api_token(self, token_hash: str) -> ApiToken | None:
        """The non-revoked token with this hash, or ``None``."""

    @abc.abstractmethod
    def revoke_api_token(self, token_id: int) -> None:
        """Revoke a token."""

    @abc.abstractmethod
    def list_api_tokens(self) -> list[ApiToken]:
        """All tokens, revoked ones too, by id."""
