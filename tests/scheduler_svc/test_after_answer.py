"""Work left for after a request's answer (`uow.after_answer`): what a registration need
not wait for (a job index's lookups, freeing the index it replaced) runs once the answer
is sent, in the order queued, and a failure in it is logged without stopping the rest."""

from __future__ import annotations

import asyncio
import logging
import weakref
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import BackgroundTasks
from sqlalchemy import Engine
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler_svc.api.deps import get_session
from scheduler_svc.config import Settings
from scheduler_svc.engine import jobindex
from scheduler_svc.engine.routes import JobIndex
from scheduler_svc.main import create_app
from scheduler_svc.services.reconciler import JobIndexCache, lookups_after_answer
from scheduler_svc.store.db import make_read_sessionmaker, make_sessionmaker
from scheduler_svc.store.uow import after_answer, answering
from scheduler_svc.twin.inprocess import served_app
from tests.scheduler_svc.helpers import event, job_body, register_nodes


@pytest.fixture
def sessions(engine: Engine) -> tuple[Any, Any]:
    return make_sessionmaker(engine), make_read_sessionmaker(engine)


def test_queued_work_runs_in_the_background_task_not_at_the_sessions_end(
    sessions: Any, caplog: pytest.LogCaptureFixture
) -> None:
    writer, reader = sessions
    app = SimpleNamespace(
        state=SimpleNamespace(
            sessionmaker=writer,
            read_sessionmaker=reader,
            notifier=SimpleNamespace(notify_threadsafe=lambda nodes: None),
        )
    )
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "app": app}
    ran: list[str] = []

    def broken() -> None:
        ran.append("broken")
        raise RuntimeError("lookups could not be made")

    async def scenario() -> None:
        background = BackgroundTasks()
        gen = get_session(Request(scope), background)
        session = await gen.__anext__()
        after_answer(session, lambda: ran.append("first"))
        after_answer(session, broken)
        after_answer(session, lambda: ran.append("third"))
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
        assert ran == []  # the session is closed, the answer not yet sent
        await background()  # what Starlette runs once the answer is out

    with caplog.at_level(logging.ERROR, logger="railover"):
        asyncio.run(scenario())
    assert ran == ["first", "broken", "third"]
    (record,) = caplog.records
    assert record.getMessage() == f"work after the answer failed: {broken!r}"
    assert "lookups could not be made" in caplog.text  # with its traceback


def test_a_session_that_serves_no_request_drops_the_work(sessions: Any) -> None:
    writer, _ = sessions
    ran: list[str] = []
    with writer() as session:
        after_answer(session, lambda: ran.append("never"))
    assert ran == []


def test_a_replaced_placements_entry_is_let_go_only_after_the_answer(sessions: Any) -> None:
    """A job placed anew replaces its entry; the old one (a 65,536-rank job's holds its
    whole index) stays alive until the work after the answer lets it go."""
    writer, _ = sessions
    cache = JobIndexCache()
    created = datetime(2026, 12, 1, tzinfo=UTC)

    def placed(placement_id: int) -> Any:  # the job's fields the cache keys an entry by
        return SimpleNamespace(job_id="j", created_at=created, placement_id=placement_id)

    with writer() as session:
        later = answering(session)
        cache.seed(session, placed(1), [(0, "a", 0)])
        _, entry = cache.job(session, placed(1))
        old = weakref.ref(entry)
        del entry
        assert later == []
        cache.seed(session, placed(2), [(0, "b", 0)])
        assert len(later) == 1
        assert old() is not None  # still held: freeing it is the answer's to skip
        later.pop()()
        assert old() is None
        _, now = cache.job(session, placed(2))
        assert now.ranks == ((0, "b", 0),) and now.nodes == {"b"}


def test_the_oldest_job_is_let_go_past_the_caches_size_after_the_answer(sessions: Any) -> None:
    writer, _ = sessions
    cache = JobIndexCache(max_jobs=2)
    created = datetime(2026, 12, 1, tzinfo=UTC)

    def job(job_id: str) -> Any:
        return SimpleNamespace(job_id=job_id, created_at=created, placement_id=1)

    with writer() as session:
        later = answering(session)
        cache.seed(session, job("j"), [(1, "a", 0), (0, "a", 1)])
        cache.seed(session, job("k"), [(0, "b", 0)])
        assert later == []  # two jobs, two places: nothing evicted, nor another job's entry
        oldest = weakref.ref(cache.job(session, job("k"))[1])
        _, j = cache.job(session, job("j"))  # read after k: k is the least recent now
        assert j.ranks == ((0, "a", 1), (1, "a", 0))  # in rank order
        cache.seed(session, job("m"), [(0, "c", 0)])
        assert len(later) == 1 and oldest() is not None
        later.pop()()
        assert oldest() is None
        assert cache.job(session, job("j"))[1] is j  # kept: read more recently than k


def test_only_an_index_with_lookups_unmade_is_queued(sessions: Any) -> None:
    index = jobindex.build(((0, "a", 0),), {}, {})
    made = jobindex.build(((0, "a", 0),), {}, {})
    made.warm()
    writer, _ = sessions
    with writer() as session:
        later = answering(session)
        lookups_after_answer(session, None)  # a job whose ranks repeat has no index
        lookups_after_answer(session, made)
        assert later == []
        lookups_after_answer(session, index)
        assert len(later) == 1 and not index.lookups.made
        later.pop()()
        assert index.lookups.made


class _Order:
    """Records, for POST /v1/jobs, when the answer's last byte goes out."""

    def __init__(self, app: ASGIApp, seen: list[str]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) != ("POST", "/v1/jobs"):
            await self.app(scope, receive, send)
            return

        async def recorded(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.seen.append("answered")
            await send(message)

        await self.app(scope, receive, recorded)


def test_a_registered_jobs_lookups_are_made_after_its_answer(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    warm = JobIndex.warm

    def recorded_warm(index: JobIndex) -> None:
        seen.append("warm: made before" if index.lookups.made else "warm")
        warm(index)

    monkeypatch.setattr(JobIndex, "warm", recorded_warm)
    app = create_app(Settings(db_url=db_url, allow_anonymous_loopback=True, coordinator=False))
    app.add_middleware(_Order, seen=seen)
    nodes = ["n1", "n2"]
    with served_app(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        register_nodes(http, nodes)
        assert seen == []
        created = http.post("/v1/jobs", json=job_body("j", nodes))
        assert created.status_code == 201, created.text
        # A fault on the job's first rank's RNIC now finds its ranks through the lookups.
        fault = event("n1", observed_at=datetime.now(UTC).isoformat())
        assert http.post("/v1/events", json={"events": [fault]}).status_code == 202
        job = http.get("/v1/jobs/j").json()
    # Not made by the registration's own pass (nothing is failed), made once, after the
    # answer: the fault found them made.
    assert seen == ["answered", "warm"]
    assert job["mode"] == "failed_over", job
