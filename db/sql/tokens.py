"""API tokens on SQL."""

from __future__ import annotations

from sqlalchemy import select, update

from db.contracts.tokens import TokenStorage
from db.errors import NotFoundError, StorageError
from db.models import ApiTokenRow
from db.sql.base import SQLBase, frozen
from db.types import TOKEN_KINDS, ApiToken


class TokenSQL(SQLBase, TokenStorage):
    """:class:`TokenStorage` on SQL."""

    def add_api_token(self, *, name: str, token_hash: str, kind: str) -> ApiToken:
        if kind not in TOKEN_KINDS:
            raise StorageError(f"unknown token kind {kind!r}")
        return self._add(ApiToken, ApiTokenRow(name=name, token_hash=token_hash, kind=kind))

    def find_api_token(self, token_hash: str) -> ApiToken | None:
        stmt = select(ApiTokenRow).where(
            ApiTokenRow.token_hash == token_hash, ApiTokenRow.revoked.is_(False)
        )
        with self._session() as session:
            row = session.scalars(stmt).one_or_none()
            return None if row is None else frozen(ApiToken, row)

    def revoke_api_token(self, token_id: int) -> None:
        with self._session(write=True) as session:
            result = session.execute(
                update(ApiTokenRow)
                .where(ApiTokenRow.id == token_id)
                .values(revoked=True)
                .execution_options(synchronize_session=False)
            )
            if result.rowcount != 1:
                raise NotFoundError(f"API token {token_id} does not exist")

    def list_api_tokens(self) -> list[ApiToken]:
        with self._session() as session:
            rows = session.scalars(select(ApiTokenRow).order_by(ApiTokenRow.id))
            return [frozen(ApiToken, r) for r in rows]
