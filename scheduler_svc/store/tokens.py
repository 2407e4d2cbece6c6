"""API tokens: stored as the hash of their secret, found by it until revoked or expired."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m

TOKEN_PREFIX = "rvr"  # noqa: S105  (a public prefix, not a secret)


def hash_secret(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def create(
        self,
        *,
        role: str,
        node: str | None,
        description: str,
        now: datetime,
        expires_at: datetime | None = None,
    ) -> tuple[m.ApiToken, str]:
        """Store a new token; the plain text is returned once and never stored."""
        token_id = secrets.token_hex(6)
        plain = f"{TOKEN_PREFIX}_{token_id}_{secrets.token_urlsafe(32)}"
        row = m.ApiToken(
            token_id=token_id,
            secret_sha256=hash_secret(plain),
            role=role,
            node=node,
            description=description,
            created_at=now,
            expires_at=expires_at,
        )
        self.s.add(row)
        self.s.flush()
        return row, plain

    def by_plain(self, plain: str, now: datetime) -> m.ApiToken | None:
        """The token with this secret, unless it is revoked or expired."""
        return self.s.scalar(
            select(m.ApiToken).where(m.ApiToken.secret_sha256 == hash_secret(plain), *_usable(now))
        )

    def count_active(self, now: datetime) -> int:
        """Tokens that still work: any at all closes anonymous access."""
        return self.s.scalar(select(func.count()).select_from(m.ApiToken).where(*_usable(now))) or 0

    def any_active(self, now: datetime) -> bool:
        """Cheaper than a count: asked on every anonymous request."""
        return self.s.scalar(select(m.ApiToken.token_id).where(*_usable(now)).limit(1)) is not None

    def all(self) -> Sequence[m.ApiToken]:
        return self.s.scalars(select(m.ApiToken).order_by(m.ApiToken.created_at)).all()

    def revoke(self, token_id: str, now: datetime) -> bool:
        res = self.s.execute(
            update(m.ApiToken)
            .where(m.ApiToken.token_id == token_id, m.ApiToken.revoked_at.is_(None))
            .values(revoked_at=now)
        )
        return bool(getattr(res, "rowcount", 0))


def _usable(now: datetime) -> tuple[Any, ...]:
    return (
        m.ApiToken.revoked_at.is_(None),
        or_(m.ApiToken.expires_at.is_(None), m.ApiToken.expires_at > now),
    )
