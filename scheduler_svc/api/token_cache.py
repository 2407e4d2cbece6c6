"""How long a replica trusts what it read of the token table.

Every /v1 request is authenticated: a bearer token is looked up by its hash, and an
anonymous loopback request asks whether any usable token exists. Each is a store read,
and for an idle fleet of long-polling agents that read is a large share of what one
poll renewal costs. `TokenCache` keeps each answer for `auth_cache_s`:

- a known token's principal, until auth_cache_s has passed since it was read or the
  token expires, whichever comes first. Unknown, revoked and expired tokens are never
  kept, so a token made anywhere works at its first use;
- whether any usable token exists (anonymous loopback access closed or open).

Writes to the token table through this replica's own sessions empty the cache when
they commit (`watch_token_writes`), so they take effect at this replica's next request.
Tokens created or revoked elsewhere (`railover token create` / `revoke`, which open the
store themselves, or another replica) take effect here within auth_cache_s: a revoked
token keeps working here that long at most, and a first token closes anonymous access
here within that. auth_cache_s = 0 reads the store on every request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import chain
from typing import Generic, TypeVar

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session, UOWTransaction, sessionmaker

from scheduler_svc.store import models as m
from scheduler_svc.store.tokens import hash_secret

T = TypeVar("T")

# Tokens kept at most (one per agent, and a few operators'); the oldest read goes first.
MAX_TOKENS = 65_536
_CHANGED = "railover_tokens_changed"


class TokenCache(Generic[T]):
    """Answers about tokens, each kept for ttl_s after it was read (thread-safe: a read
    runs in a worker thread, and sync routes such as the status page ask too)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[float, T]] = {}
        self._any: tuple[float, bool] | None = None
        # Bumped by every invalidation: a read that began before one is not kept.
        self._generation = 0

    def token(self, plain: str, read: Callable[[], tuple[T | None, datetime | None]]) -> T | None:
        """The principal of this token (None: unknown, revoked or expired), from `read`
        (which returns it and the token's expiry) when not kept."""
        if self.ttl_s <= 0:
            return read()[0]
        key = hash_secret(plain)
        now = self._clock()
        with self._lock:
            kept = self._tokens.get(key)
            if kept is not None and now < kept[0]:
                return kept[1]
            generation = self._generation
        found, expires_at = read()
        if found is None:
            return None
        keep = self.ttl_s
        if expires_at is not None:
            keep = min(keep, (expires_at - datetime.now(UTC)).total_seconds())
        if keep > 0:
            with self._lock:
                if generation == self._generation:
                    self._tokens.pop(key, None)
                    if len(self._tokens) >= MAX_TOKENS:
                        del self._tokens[next(iter(self._tokens))]
                    self._tokens[key] = (now + keep, found)
        return found

    def holds(self, plain: str) -> bool:
        """Whether `token(plain, ...)` would answer now without reading (an event-loop
        caller's test before it hands a read to a worker thread). The entry can lapse
        between this and the call, which then reads the store where it runs. (With
        ttl_s <= 0 nothing is ever kept, so nothing is held.)"""
        kept = self._tokens.get(hash_secret(plain))
        return kept is not None and self._clock() < kept[0]

    def holds_any(self) -> bool:
        """Whether `any_active(...)` would answer now without reading (as `holds`)."""
        kept = self._any
        return kept is not None and self._clock() < kept[0]

    def any_active(self, read: Callable[[], bool]) -> bool:
        """Whether a usable token exists, from `read` when not kept."""
        if self.ttl_s <= 0:
            return read()
        now = self._clock()
        with self._lock:
            if self._any is not None and now < self._any[0]:
                return self._any[1]
            generation = self._generation
        found = read()
        with self._lock:
            if generation == self._generation:
                self._any = (now + self.ttl_s, found)
        return found

    def invalidate(self) -> None:
        """Forget everything read so far (the token table changed)."""
        with self._lock:
            self._generation += 1
            self._tokens.clear()
            self._any = None


def watch_token_writes(sessions: sessionmaker[Session], changed: Callable[[], None]) -> None:
    """Call `changed` after each commit, through these sessions, that wrote the token
    table: ORM objects added, changed or deleted, or an ORM UPDATE/DELETE on it."""

    @event.listens_for(sessions, "after_flush")
    def _flushed(session: Session, _: UOWTransaction) -> None:
        written = chain(session.new, session.dirty, session.deleted)
        if any(isinstance(obj, m.ApiToken) for obj in written):
            session.info[_CHANGED] = True

    @event.listens_for(sessions, "do_orm_execute")
    def _executed(state: ORMExecuteState) -> None:
        if (state.is_update or state.is_delete) and any(
            mapper.class_ is m.ApiToken for mapper in state.all_mappers
        ):
            state.session.info[_CHANGED] = True

    @event.listens_for(sessions, "after_commit")
    def _committed(session: Session) -> None:
        if session.info.pop(_CHANGED, False):
            changed()

    @event.listens_for(sessions, "after_rollback")
    def _rolled_back(session: Session) -> None:
        session.info.pop(_CHANGED, None)
