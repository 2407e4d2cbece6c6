"""The collector pause around whole-job work: nested and threaded pauses, a collector
that was already off, and a request with a large body."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler_svc.config import Settings
from scheduler_svc.main import PauseCollectorForLargeBodies, create_app
from scheduler_svc.services import gcpause
from scheduler_svc.twin.inprocess import served_app
from tests.scheduler_svc.helpers import job_body

JSON = {"content-type": "application/json"}


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_the_collector_is_off_inside_and_on_again_after() -> None:
    with gcpause.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_it_is_on_again_after_an_error_inside() -> None:
    with pytest.raises(RuntimeError), gcpause.paused():
        raise RuntimeError("whole-job work failed")
    assert gc.isenabled()


def test_nested_pauses_resume_only_when_the_outermost_ends() -> None:
    with gcpause.paused():
        with gcpause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_new_tally_of_pauses_starts_with_none() -> None:
    """The process has one tally, made at import; a new one behaves the same from scratch."""
    pauses = gcpause._Pauses()
    pauses.enter()
    assert not gc.isenabled()
    pauses.leave()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with gcpause.paused():
        pass
    assert not gc.isenabled()


def test_pauses_in_two_threads_resume_when_the_last_ends() -> None:
    inside = threading.Event()
    release = threading.Event()

    def other() -> None:
        with gcpause.paused():
            inside.set()
            release.wait()

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with gcpause.paused():
        pass
    assert not gc.isenabled()  # the other thread's pause still holds
    release.set()
    t.join(10)
    assert not t.is_alive()
    assert gc.isenabled()


# --- a request with a large body (scheduler_svc.main.PauseCollectorForLargeBodies) --------


class _Collections:
    """Collections the collector starts (in any thread) from the first read of a request's
    body to its answer's start, for requests to `path`. Outermost, so the service's own
    middleware has taken its decision by the time the body is read."""

    def __init__(self, app: ASGIApp, path: str, seen: list[int]) -> None:
        self.app, self.path, self.seen = app, path, seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        started: list[int] = []

        async def read(*_: Any) -> Message:
            if not started:
                started.append(_COUNT[0])
            return await receive()

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.seen.append(_COUNT[0] - started[0])
            await send(message)

        await self.app(scope, read, counted)


_COUNT = [0]


def _count_start(phase: str, _info: dict[str, int]) -> None:
    if phase == "start":
        _COUNT[0] += 1


def _ranks_body(ranks: int) -> bytes:
    # Valid but for one field, so validation reads every rank and nothing is stored.
    body = job_body("big", [f"n{i:05d}" for i in range(ranks // 8)], checkpoint_interval_s=-1)
    return json.dumps(body).encode()


def test_a_large_body_is_validated_and_answered_with_the_collector_paused(db_url: str) -> None:
    """A 70,000-rank job's body (over 2 MB) makes a few hundred thousand objects in the
    body's validation; declared that large, no collection runs until it is answered.
    The same body sent without a length (chunked) sets off collections: the check can fail."""
    seen: list[int] = []
    app = create_app(Settings(db_url=db_url, allow_anonymous_loopback=True, coordinator=False))
    app.add_middleware(_Collections, path="/v1/jobs", seen=seen)
    raw = _ranks_body(70_000)
    assert len(raw) > 2 << 20
    gc.callbacks.append(_count_start)
    try:
        with served_app(app) as url, httpx.Client(base_url=url, timeout=120) as http:
            declared = http.post("/v1/jobs", content=raw, headers=JSON)
            chunked = http.post("/v1/jobs", content=iter([raw]), headers=JSON)
    finally:
        gc.callbacks.remove(_count_start)
    assert declared.status_code == chunked.status_code == 422, declared.text[:300]
    assert "checkpoint_interval_s" in declared.text
    assert seen[0] == 0
    assert seen[1] > 10, seen
    assert gc.isenabled()


@pytest.mark.parametrize(
    ("headers", "paused"),
    [
        ([(b"content-length", b"1048576")], True),
        ([(b"content-type", b"application/json"), (b"content-length", b"3000000")], True),
        ([(b"content-length", b"1048575")], False),
        ([(b"transfer-encoding", b"chunked")], False),
        ([(b"content-length", b"12x")], False),
        ([], False),
    ],
)
def test_the_pause_is_for_declared_bodies_of_a_mebibyte_or_more(
    headers: list[tuple[bytes, bytes]], paused: bool
) -> None:
    inside: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        inside.append(gc.isenabled())

    scope = {"type": "http", "method": "POST", "path": "/v1/jobs", "headers": headers}
    asyncio.run(PauseCollectorForLargeBodies(app)(scope, _nothing, _nothing))
    assert inside == [not paused]
    assert gc.isenabled()


def test_the_collector_comes_back_after_a_large_request_that_raises() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert not gc.isenabled()
        raise RuntimeError("the route failed")

    scope = {"type": "http", "path": "/", "headers": [(b"content-length", b"2000000")]}
    with pytest.raises(RuntimeError):
        asyncio.run(PauseCollectorForLargeBodies(app)(scope, _nothing, _nothing))
    assert gc.isenabled()


async def _nothing(*_: Any) -> Any:
    return None
