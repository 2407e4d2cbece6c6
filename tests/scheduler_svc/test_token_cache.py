"""The token cache: what it keeps, for how long, and what empties it.

The unit tests count the store reads a cache makes on a hand-moved clock; the rest
run the real service, where a token written through the app's own sessions takes
effect at the next request and one written elsewhere within the cache's time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, update

from railover_testing.local import served_app
from scheduler_svc.api import token_cache
from scheduler_svc.api.token_cache import TokenCache, watch_token_writes
from scheduler_svc.config import Settings
from scheduler_svc.main import create_app
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.tokens import TokenRepo


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Store:
    """Stands in for the token table: counts the reads made through it."""

    def __init__(self) -> None:
        self.tokens: dict[str, tuple[str, datetime | None]] = {}
        self.reads: list[str] = []

    def token(self, plain: str) -> tuple[str | None, datetime | None]:
        self.reads.append(plain)
        found = self.tokens.get(plain)
        return (None, None) if found is None else found

    def any_active(self) -> bool:
        self.reads.append("any")
        return bool(self.tokens)


def test_a_known_token_is_read_once_per_ttl() -> None:
    clock, store = Clock(), Store()
    cache: TokenCache[str] = TokenCache(2.0, clock)
    store.tokens["a"] = ("principal-a", None)
    assert cache.token("a", lambda: store.token("a")) == "principal-a"
    clock.now += 1.9
    assert cache.token("a", lambda: store.token("a")) == "principal-a"
    assert store.reads == ["a"]
    # Revoked in the store: still answered from the cache until its time is up, then not.
    del store.tokens["a"]
    assert cache.token("a", lambda: store.token("a")) == "principal-a"
    clock.now += 0.1
    assert cache.token("a", lambda: store.token("a")) is None
    assert store.reads == ["a", "a"]


def test_unknown_tokens_are_never_kept() -> None:
    clock, store = Clock(), Store()
    cache: TokenCache[str] = TokenCache(2.0, clock)
    assert cache.token("b", lambda: store.token("b")) is None
    store.tokens["b"] = ("principal-b", None)  # made elsewhere: works at its first use
    assert cache.token("b", lambda: store.token("b")) == "principal-b"
    assert store.reads == ["b", "b"]


def test_a_token_is_not_kept_past_its_expiry() -> None:
    clock, store = Clock(), Store()
    cache: TokenCache[str] = TokenCache(60.0, clock)
    store.tokens["soon"] = ("p", datetime.now(UTC) + timedelta(seconds=1))
    store.tokens["gone"] = ("p", datetime.now(UTC) - timedelta(seconds=1))
    for _ in range(2):
        assert cache.token("soon", lambda: store.token("soon")) == "p"
        assert cache.token("gone", lambda: store.token("gone")) == "p"
    assert store.reads == ["soon", "gone", "gone"]  # "gone" is read each time
    clock.now += 1.0  # its expiry, though the cache's 60 s are not over
    cache.token("soon", lambda: store.token("soon"))
    assert store.reads == ["soon", "gone", "gone", "soon"]


def test_any_active_is_kept_both_ways_and_invalidated() -> None:
    clock, store = Clock(), Store()
    cache: TokenCache[str] = TokenCache(2.0, clock)
    assert cache.any_active(store.any_active) is False
    store.tokens["a"] = ("p", None)
    assert cache.any_active(store.any_active) is False  # kept: made elsewhere
    clock.now += 2.0
    assert cache.any_active(store.any_active) is True
    assert store.reads == ["any", "any"]
    del store.tokens["a"]
    cache.invalidate()  # made through this replica: at once
    assert cache.any_active(store.any_active) is False
    assert cache.token("a", lambda: store.token("a")) is None
    assert store.reads == ["any", "any", "any", "a"]


def test_a_read_overtaken_by_an_invalidation_is_not_kept() -> None:
    clock, store = Clock(), Store()
    cache: TokenCache[str] = TokenCache(2.0, clock)
    store.tokens["a"] = ("p", None)

    def read_then_revoked() -> tuple[str | None, datetime | None]:
        found = store.token("a")
        cache.invalidate()  # committed while this read was on its way back
        return found

    def any_then_changed() -> bool:
        found = store.any_active()
        cache.invalidate()
        return found

    assert cache.token("a", read_then_revoked) == "p"
    assert cache.any_active(any_then_changed) is True
    cache.token("a", lambda: store.token("a"))
    cache.any_active(store.any_active)
    assert store.reads == ["a", "any", "a", "any"]


def test_zero_reads_every_time_and_the_size_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store()
    store.tokens = {name: (name, None) for name in "abc"}
    off: TokenCache[str] = TokenCache(0.0, Clock())
    for _ in range(2):
        off.token("a", lambda: store.token("a"))
        off.any_active(store.any_active)
    assert store.reads == ["a", "any", "a", "any"]
    store.reads.clear()
    monkeypatch.setattr(token_cache, "MAX_TOKENS", 2)
    cache: TokenCache[str] = TokenCache(2.0, Clock())
    for name in "abcc":
        cache.token(name, lambda n=name: store.token(n))  # type: ignore[misc]
    cache.token("b", lambda: store.token("b"))  # kept
    cache.token("a", lambda: store.token("a"))  # the oldest, let go for "c"
    assert store.reads == ["a", "b", "c", "a"]


def test_token_writes_through_the_sessions_are_seen_at_commit(engine: Engine) -> None:
    sessions = make_sessionmaker(engine)
    changes: list[str] = []
    watch_token_writes(sessions, lambda: changes.append("changed"))
    now = datetime.now(UTC)
    with sessions() as s:
        row, _ = TokenRepo(s).create(role="fleet", node=None, description="", now=now)
        s.flush()
        assert changes == []  # not before the commit
        s.commit()
    assert changes == ["changed"]
    with sessions() as s:
        TokenRepo(s).create(role="fleet", node=None, description="", now=now)
        s.flush()
        s.rollback()
    with sessions() as s:
        s.execute(update(m.Node).where(m.Node.name == "none").values(name="none"))
        s.commit()
    assert changes == ["changed"]  # rolled back, or another table's update
    with sessions() as s:
        assert TokenRepo(s).revoke(row.token_id, now)  # an ORM UPDATE, no object
        s.commit()
    assert changes == ["changed", "changed"]
    # Sessions of another sessionmaker (another process's, in effect) are not watched.
    with make_sessionmaker(engine)() as s:
        TokenRepo(s).create(role="fleet", node=None, description="", now=now)
        s.commit()
    assert changes == ["changed", "changed"]


@contextmanager
def serving(app: FastAPI) -> Iterator[httpx.Client]:
    with served_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def test_the_service_keeps_answers_until_a_local_write_or_the_ttl(settings: Settings) -> None:
    clock = Clock()
    app = create_app(settings.model_copy(update={"host": "127.0.0.1", "auth_cache_s": 5.0}))
    assert app.state.token_cache.ttl_s == 5.0
    app.state.token_cache = TokenCache(5.0, clock)  # same cache, on a clock the test moves
    other = make_engine(settings.sqlalchemy_url)
    try:
        with serving(app) as http:
            assert http.get("/v1/jobs").status_code == 200  # open: no token yet
            # A token made elsewhere (railover token create): closes it within the ttl.
            with make_sessionmaker(other)() as s:
                now = datetime.now(UTC)
                row, plain = TokenRepo(s).create(role="fleet", node=None, description="", now=now)
                s.commit()
            assert http.get("/v1/jobs").status_code == 200
            clock.now += 5.0
            assert http.get("/v1/jobs").status_code == 401
            auth = {"Authorization": f"Bearer {plain}"}
            assert http.get("/v1/jobs", headers=auth).status_code == 200  # works at once
            # Revoked elsewhere: still answered within the ttl, refused after it.
            with make_sessionmaker(other)() as s:
                TokenRepo(s).revoke(row.token_id, datetime.now(UTC))
                s.commit()
            assert http.get("/v1/jobs", headers=auth).status_code == 200
            clock.now += 5.0
            assert http.get("/v1/jobs", headers=auth).status_code == 401
            # Through this replica's own sessions: at once, both ways.
            with app.state.sessionmaker() as s:
                row, plain = TokenRepo(s).create(role="viewer", node=None, description="", now=now)
                s.commit()
            auth = {"Authorization": f"Bearer {plain}"}
            assert http.get("/v1/jobs", headers=auth).status_code == 200
            with app.state.sessionmaker() as s:
                TokenRepo(s).revoke(row.token_id, datetime.now(UTC))
                s.commit()
            assert http.get("/v1/jobs", headers=auth).status_code == 401
    finally:
        other.dispose()
