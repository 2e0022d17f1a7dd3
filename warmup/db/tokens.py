"""API bearer tokens with scopes, stored hashed.

A token is shown once, when it is created; the database keeps its sha256 (tokens are 256 random
bits, so a fast hash is enough: there is nothing to brute-force). Scopes:

- read: plans, manifests, blobs, job status, coverage reports (what a training pod needs);
- submit: warm-up submissions (CI);
- worker: reserved for workers that reach the service over HTTP (workers today use the database
  and the bucket directly);
- admin: everything, including token management.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, func, select, update

from warmup.db import models as m
from warmup.db.columns import db_now
from warmup.db.engine import make_sessionmaker

SCOPES = ("read", "submit", "worker", "admin")
TOKEN_PREFIX = "wu_"


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def grants(scopes: frozenset[str] | set[str], needed: str) -> bool:
    """Whether a token with `scopes` may do what needs `needed` (admin may do everything)."""
    return needed in scopes or "admin" in scopes


@dataclass(frozen=True)
class TokenInfo:
    id: uuid.UUID
    name: str
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None


class TokenStore:
    def __init__(self, engine: Engine) -> None:
        self._sessions = make_sessionmaker(engine)

    def create(self, name: str, scopes: list[str]) -> tuple[TokenInfo, str]:
        """A new token; the plain token is returned here and never again."""
        unknown = sorted(set(scopes) - set(SCOPES))
        if unknown or not scopes:
            raise ValueError(f"scopes must be some of {', '.join(SCOPES)}; got {', '.join(scopes) or 'none'}")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        row = m.Token(name=name, scopes=sorted(set(scopes)), token_sha256=token_sha256(token))
        with self._sessions.begin() as session:
            session.add(row)
            session.flush()
            info = _info(row)
        return info, token

    def scopes_of(self, token: str) -> frozenset[str] | None:
        """The scopes of a live token, or None for an unknown or revoked one."""
        with self._sessions() as session:
            row = session.execute(
                select(m.Token).where(
                    m.Token.token_sha256 == token_sha256(token), m.Token.revoked_at.is_(None)
                )
            ).scalar_one_or_none()
            return frozenset(row.scopes) if row else None

    def revocations(self) -> tuple[int, datetime | None]:
        """(how many tokens are revoked, the latest revocation): changes whenever a token is revoked, and
        costs one read of a table of a few rows, so an API process can ask it every second."""
        with self._sessions() as session:
            count, latest = session.execute(
                select(func.count(), func.max(m.Token.revoked_at)).where(m.Token.revoked_at.is_not(None))
            ).one()
            return int(count), latest

    def list(self) -> list[TokenInfo]:
        with self._sessions() as session:
            return [
                _info(row) for row in session.execute(select(m.Token).order_by(m.Token.created_at)).scalars()
            ]

    def revoke(self, token_id: uuid.UUID) -> bool:
        with self._sessions.begin() as session:
            result = session.execute(
                update(m.Token)
                .where(m.Token.id == token_id, m.Token.revoked_at.is_(None))
                .values(revoked_at=db_now())
            )
            return cast(CursorResult[Any], result).rowcount > 0


def _info(row: m.Token) -> TokenInfo:
    return TokenInfo(
        id=row.id,
        name=row.name,
        scopes=tuple(row.scopes),
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )
