"""The delivery worker driven cycle by cycle (run_once, no thread, no HTTP API).

Each cycle is called by the test, so what a cycle did is counted, not timed:
a real store (SQLite and PostgreSQL), a real loopback receiver.
"""

from __future__ import annotations

from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from railover_testing.local import free_port
from railover_testing.waiting import wait_until
from scheduler_svc.fleet.events import emit
from scheduler_svc.fleet.repositories import DEAD, DELIVERED, PENDING, OutboxRepo, SubscriptionRepo
from scheduler_svc.fleet.signing import verify
from scheduler_svc.fleet.webhooks import USER_AGENT, DeliveryFailed, post_event
from scheduler_svc.fleet.worker import DeliveryWorker, backoff_s, target_kind
from scheduler_svc.store import models as m
from tests.fleet.conftest import Receiver
from tests.fleet.helpers import SECRET, fast


def subscribe(sessions: sessionmaker[Session], url: str, **kw: Any) -> str:
    with sessions() as s, s.begin():
        sub = SubscriptionRepo(s).create(
            url=url,
            event_types=kw.get("event_types", []),
            job_id=kw.get("job_id"),
            description="",
            secret=SECRET,
            created_by=None,
            now=datetime.now(UTC),
        )
        return sub.subscription_id


def queue(sessions: sessionmaker[Session], n: int = 1, job_id: str | None = None) -> list[str]:
    ids = []
    with sessions() as s, s.begin():
        for i in range(n):
            ids.append(
                emit(
                    s,
                    "io.railover.switch.fault",
                    job_id=job_id,
                    subject=f"switch/s{i}",
                    data={"i": i},
                )
            )
    return ids


def deliveries(sessions: sessionmaker[Session]) -> list[m.Delivery]:
    with sessions() as s:
        return list(s.scalars(select(m.Delivery).order_by(m.Delivery.id)).all())


def worker(sessions: sessionmaker[Session], db_url: str, **settings: Any) -> DeliveryWorker:
    return DeliveryWorker(sessions, fast(db_url, **settings), rnd=lambda: 0.0)


def close(w: DeliveryWorker) -> None:
    """Free a worker that was driven by run_once and never started.

    (DeliveryWorker.stop() expects start() first: it removes the commit listener
    that start() adds, and SQLAlchemy refuses to remove one that is not there.)
    """
    w.close_unstarted()


def test_backoff_is_exponential_capped_and_half_jittered() -> None:
    assert backoff_s(1, 1.0, 60.0, lambda: 0.0) == 0.5
    assert backoff_s(1, 1.0, 60.0, lambda: 1.0) == 1.0
    assert backoff_s(3, 1.0, 60.0, lambda: 0.0) == 2.0
    assert backoff_s(10, 1.0, 60.0, lambda: 1.0) == 60.0
    assert backoff_s(0, 2.0, 60.0, lambda: 0.5) == 1.5


def test_target_kinds_are_bounded() -> None:
    assert [target_kind(t) for t in ("sub:abc", "job:j1", "k8s", "slurm")] == [
        "webhook",
        "webhook",
        "k8s",
        "slurm",
    ]


def test_one_cycle_sends_signed_events_in_order(
    sessions: sessionmaker[Session], db_url: str, receiver: Receiver
) -> None:
    subscribe(sessions, receiver.url)
    ids = queue(sessions, 3, job_id=None)
    w = worker(sessions, db_url)
    try:
        # One lane (one target, no job): only its head is handed out per cycle.
        assert [w.run_once() for _ in range(4)] == [1, 1, 1, 0]
    finally:
        close(w)
    assert [r.event["id"] for r in receiver.requests] == ids
    for r in receiver.requests:
        verify(SECRET, r.headers["railover-signature"], r.body)
    rows = deliveries(sessions)
    assert [(d.state, d.attempts, d.last_status, d.last_error) for d in rows] == [
        (DELIVERED, 1, 200, None)
    ] * 3


def test_refusals_are_retried_after_backoff_then_dead(
    sessions: sessionmaker[Session], db_url: str, receiver: Receiver
) -> None:
    receiver.fail = lambda _e: True
    subscribe(sessions, receiver.url)
    queue(sessions)
    # Backoff of an hour: a retry is not due again within this test unless made due.
    w = worker(
        sessions,
        db_url,
        webhook_backoff_base_s=3600.0,
        webhook_backoff_max_s=7200.0,
        webhook_max_attempts=2,
    )
    try:
        before = datetime.now(UTC)
        assert w.run_once() == 1
        (d,) = deliveries(sessions)
        assert (d.state, d.attempts, d.last_status, d.last_error) == (PENDING, 1, 500, "HTTP 500")
        assert d.next_attempt_at >= before + timedelta(seconds=1800)
        assert w.run_once() == 0  # not due yet
        with sessions() as s, s.begin():
            s.get(m.Delivery, d.id).next_attempt_at = before  # type: ignore[union-attr]
        assert w.run_once() == 1
        (d,) = deliveries(sessions)
        assert (d.state, d.attempts) == (DEAD, 2)
        assert d.dead_at is not None
        assert w.run_once() == 0
    finally:
        close(w)
    assert [r.status for r in receiver.requests] == [500, 500]


def test_a_deleted_subscription_cancels_what_it_had_pending(
    sessions: sessionmaker[Session], db_url: str, receiver: Receiver
) -> None:
    sub_id = subscribe(sessions, receiver.url)
    queue(sessions, 2)
    with sessions() as s, s.begin():
        sub = SubscriptionRepo(s).get(sub_id)
        assert sub is not None
        SubscriptionRepo(s).delete(sub)
    w = worker(sessions, db_url)
    try:
        assert w.run_once() == 0
    finally:
        close(w)
    assert receiver.requests == []
    assert [d.state for d in deliveries(sessions)] == ["cancelled", "cancelled"]


def test_a_second_worker_does_not_take_a_claimed_head(
    sessions: sessionmaker[Session], db_url: str, receiver: Receiver
) -> None:
    subscribe(sessions, receiver.url)
    queue(sessions)
    now = datetime.now(UTC)
    with sessions() as s, s.begin():
        (claimed,) = OutboxRepo(s).claim(
            worker="other-replica", now=now, until=now + timedelta(hours=1), limit=10
        )
    w = worker(sessions, db_url)
    try:
        assert w.run_once() == 0  # leased to the other replica
        with sessions() as s, s.begin():
            OutboxRepo(s).release("other-replica")
        assert w.run_once() == 1
    finally:
        close(w)
    assert [r.status for r in receiver.requests] == [200]
    assert deliveries(sessions)[0].id == claimed.id


def test_wakes_on_a_commit_that_queued_an_event(
    sessions: sessionmaker[Session], db_url: str, receiver: Receiver
) -> None:
    """The worker's thread sleeps up to delivery_poll_s; a commit with an event wakes it."""
    subscribe(sessions, receiver.url)
    w = worker(sessions, db_url, delivery_poll_s=60.0)
    cycles: list[int] = []
    inner = w.dispatch

    def counted() -> list[Future[None]]:
        handed_out = inner()
        cycles.append(len(handed_out))
        return handed_out

    w.dispatch = counted  # type: ignore[method-assign]
    w.start()
    try:
        # The first cycle found nothing: the thread now idles until woken or 60 s pass.
        assert wait_until(lambda: cycles[:1] == [0], timeout=30)
        queue(sessions)
        # Well below the 60 s idle poll (the most Settings allows): only the after-commit
        # wake-up delivers in time; generous for a loaded machine all the same.
        got = receiver.wait_for(1, timeout_s=30)
    finally:
        w.stop()
    assert len(got) == 1
    assert cycles[:2] == [0, 1]


def test_post_event_answers_and_failures(
    sessions: sessionmaker[Session], receiver: Receiver
) -> None:
    (event_id,) = queue(sessions)
    with sessions() as s:
        ev = s.scalars(select(m.OutboxEvent)).one()
    assert ev.event_id == event_id
    with httpx.Client(timeout=5) as client:
        assert post_event(client, receiver.url, SECRET, ev, 5.0) == 200
        (r,) = receiver.requests
        assert r.headers["user-agent"] == USER_AGENT == "railover-webhooks/1"
        assert r.headers["content-type"] == "application/cloudevents+json"
        assert verify(SECRET, r.headers["railover-signature"], r.body) > 0
        receiver.fail = lambda _e: True
        with pytest.raises(DeliveryFailed) as refused:
            post_event(client, receiver.url, SECRET, ev, 5.0)
        assert (str(refused.value), refused.value.status) == ("HTTP 500", 500)
        with pytest.raises(DeliveryFailed) as unreachable:
            post_event(client, f"http://127.0.0.1:{free_port()}/", SECRET, ev, 5.0)
        assert str(unreachable.value).startswith("ConnectError: ")
        assert unreachable.value.status is None


def test_a_transaction_reads_the_subscriptions_once_and_sees_its_own_changes(
    engine: Engine, sessions: sessionmaker[Session]
) -> None:
    """A switch point announces every command in one transaction: the subscriptions are read
    once for it, by job; one made or deleted in the transaction counts from then on, and
    one another transaction made counts from the next transaction."""
    statements: list[str] = []

    def executed(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "FROM subscriptions" in statement:
            statements.append(statement)

    event.listen(engine, "before_cursor_execute", executed)
    try:
        first = subscribe(sessions, "http://127.0.0.1:9/a", job_id="j1")
        with sessions() as s, s.begin():
            for i in range(5):
                emit(s, "io.railover.command.applied", job_id="j1", subject=f"command/{i}", data={})
            emit(s, "io.railover.switch.fault", job_id=None, subject="switch/s", data={})
            assert len(statements) == 2  # j1's and the cluster's
            later = SubscriptionRepo(s).create(
                url="http://127.0.0.1:9/b", event_types=["io.railover.command.applied"],
                job_id=None, description="", secret=SECRET, created_by=None,
                now=datetime.now(UTC),
            )  # fmt: skip
            emit(s, "io.railover.command.applied", job_id="j1", subject="command/9", data={})
            emit(s, "io.railover.switch.fault", job_id=None, subject="switch/t", data={})
            gone = SubscriptionRepo(s).get(first)
            assert gone is not None
            SubscriptionRepo(s).delete(gone)
            emit(s, "io.railover.command.applied", job_id="j1", subject="command/10", data={})
        # Made by another transaction meanwhile: seen by this session's next transaction.
        with sessions() as s:
            with s.begin():
                emit(s, "io.railover.switch.fault", job_id=None, subject="switch/u", data={})
            third = subscribe(sessions, "http://127.0.0.1:9/c")
            with s.begin():
                emit(s, "io.railover.switch.fault", job_id=None, subject="switch/v", data={})
    finally:
        event.remove(engine, "before_cursor_execute", executed)
    targets = [(d.outbox_id, d.target) for d in deliveries(sessions)]
    per_event = [
        sorted(t for o, t in targets if o == outbox) for outbox in sorted({o for o, _ in targets})
    ]
    assert per_event == (
        [[f"sub:{first}"]] * 5
        + [sorted([f"sub:{first}", f"sub:{later.subscription_id}"])]
        + [[f"sub:{later.subscription_id}"]]
        + [[f"sub:{third}"]]
    )
