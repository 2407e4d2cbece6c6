"""Hostile webhook receivers and URLs, against the real delivery worker on a real store.

Before issue 30: a receiver trickling one byte a second stopped every delivery, fleet
actions included, for over 70 s (httpx's timeout is per read); 127.0.0.1, [::1], 0.0.0.0
and 169.254.169.254 were accepted and posted to; user:pass@ URLs were printed.

Nothing here sends a byte anywhere but loopback: names resolve through a stub resolver,
and the addresses refused are refused before any connection is made.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from railover_testing.local import local_service
from railover_testing.waiting import wait_until
from railover_testing.webhook_receivers import Trickler
from scheduler_svc.config import Settings
from scheduler_svc.fleet.events import emit
from scheduler_svc.fleet.outbound import AddressPolicy, check_url, redact
from scheduler_svc.fleet.repositories import DELIVERED, SubscriptionRepo
from scheduler_svc.fleet.worker import DeliveryWorker
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker
from tests.fleet.conftest import Receiver, receiver
from tests.fleet.helpers import SECRET, fast

__all__ = ["receiver"]  # the fixture, shared with tests/fleet


@pytest.fixture
def store(sqlite_migrated: Path, tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    path = tmp_path / "railover.db"
    shutil.copyfile(sqlite_migrated, path)
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    yield url, engine
    engine.dispose()


def subscribe(sessions: sessionmaker[Session], url: str) -> str:
    with sessions() as s, s.begin():
        row = SubscriptionRepo(s).create(
            url=url,
            event_types=[],
            job_id=None,
            description="",
            secret=SECRET,
            created_by=None,
            now=datetime.now(UTC),
        )
        return row.subscription_id


def queue(sessions: sessionmaker[Session], n: int) -> None:
    with sessions() as s, s.begin():
        for i in range(n):
            # One job id per event: each its own lane, so they are not sent one by one.
            emit(s, "io.railover.switch.fault", job_id=f"j{i}", subject=f"switch/s{i}", data={})


def rows(sessions: sessionmaker[Session], target: str) -> list[m.Delivery]:
    with sessions() as s:
        query = select(m.Delivery).where(m.Delivery.target == target)
        return list(s.scalars(query.order_by(m.Delivery.id)).all())


def test_a_trickling_receiver_holds_one_slot_for_one_deadline_and_delays_no_one_else(
    store: tuple[str, Engine], receiver: Receiver
) -> None:
    url, engine = store
    sessions = make_sessionmaker(engine)
    trickler = Trickler()
    slow = subscribe(sessions, trickler.url)
    subscribe(sessions, receiver.url)
    # Four slots: the trickler's 20 lanes (one per job) could take them all, were the
    # cycle still waiting for its whole batch or a target allowed more than one.
    settings = fast(url, delivery_concurrency=4, webhook_timeout_s=1.0, webhook_max_attempts=2)
    worker = DeliveryWorker(sessions, settings, rnd=lambda: 0.0)
    queue(sessions, 20)
    worker.start()
    try:
        receiver.wait_for(20, timeout_s=60)
        # The trickler's attempts end at their deadline, as timeouts, to be retried.
        assert wait_until(
            lambda: any("Timeout" in (r.last_error or "") for r in rows(sessions, f"sub:{slow}")),
            timeout=60,
        ), [(r.attempts, r.last_error, r.state) for r in rows(sessions, f"sub:{slow}")]
    finally:
        worker.stop()
        trickler.close()
    # Its 20 lanes never held more than one slot at a time (two connections overlap for
    # the moment between a hang-up at the deadline and the trickler seeing it).
    assert trickler.connections >= 1 and trickler.most_open <= 2


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:9/hook", "loopback"),
        ("http://[::1]:9/hook", "loopback"),
        ("http://localhost:9/hook", "loopback"),
        ("http://0.0.0.0:9/hook", "unspecified"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://[fe80::1]/hook", "link-local"),
        ("http://[::ffff:127.0.0.1]/hook", "loopback"),
        ("http://224.0.0.1/hook", "multicast"),
    ],
)
def test_forbidden_literal_addresses_are_refused_at_validation(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        check_url(url, AddressPolicy(allow_loopback=False))


def test_private_addresses_only_where_the_setting_allows() -> None:
    check_url("http://10.1.2.3/hook", AddressPolicy())
    with pytest.raises(ValueError, match="private"):
        check_url("http://10.1.2.3/hook", AddressPolicy(allow_private=False))
    check_url("http://hooks.example/hook", AddressPolicy(allow_private=False))  # a name: later


def test_the_api_refuses_them_with_422_naming_the_field(tmp_path: Path) -> None:
    settings = Settings(
        db_url=f"sqlite:///{tmp_path / 'r.db'}",
        port=0,
        allow_anonymous_loopback=True,
        notify_secret="s" * 32,
    )
    with local_service(settings) as base, httpx.Client(base_url=base, timeout=30) as http:
        for url in ("http://127.0.0.1:9/", "http://169.254.169.254/", "http://[::1]/"):
            r = http.post("/v1/subscriptions", json={"url": url, "secret": SECRET})
            assert r.status_code == 422 and "url:" in r.text, r.text
        assert http.get("/v1/subscriptions").json()["subscriptions"] == []
        # A name passes (checked again after resolution); its password is never shown.
        body = {"url": "http://u:pw-123@hooks.example/h", "secret": SECRET}
        created = http.post("/v1/subscriptions", json=body)
        assert created.status_code == 201, created.text
        listed = http.get("/v1/subscriptions").text
        assert "pw-123" not in created.text + listed and "***@hooks.example" in listed


def stub(answers: dict[str, list[str]]) -> Any:
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers[host]

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


def test_a_name_resolving_to_a_forbidden_address_is_refused_before_connecting(
    store: tuple[str, Engine], receiver: Receiver
) -> None:
    """hooks.example passes validation (a name), then resolves to loopback or the metadata
    address: refused at connection time, nothing sent. Allowed, the worker connects to
    the address it checked (the loopback receiver), not to whatever the name says later."""
    url, engine = store
    sessions = make_sessionmaker(engine)
    port = receiver.url.rsplit(":", 1)[1]
    subscribe(sessions, f"http://hooks.example:{port}/hook")
    subscribe(sessions, f"http://metadata.example:{port}/hook")
    resolver = stub({"hooks.example": ["127.0.0.1"], "metadata.example": ["169.254.169.254"]})
    closed = fast(url, webhook_allow_loopback=False)
    worker = DeliveryWorker(sessions, closed, rnd=lambda: 0.0, resolver=resolver)
    queue(sessions, 1)
    try:
        assert worker.run_once() == 2
    finally:
        worker.close_unstarted()
    errors = [str(r.last_error) for r in all_rows(sessions)]
    assert any("loopback address; not sent" in e for e in errors), errors
    assert any("link-local address; not sent" in e for e in errors), errors
    assert receiver.requests == []
    # The same name, loopback allowed: delivered to the address the stub gave.
    with sessions() as s, s.begin():
        SubscriptionRepo(s).delete(SubscriptionRepo(s).all()[1])
    opened = fast(url, webhook_allow_loopback=True)
    worker = DeliveryWorker(sessions, opened, rnd=lambda: 0.0, resolver=resolver)
    try:
        assert wait_until(lambda: worker.run_once() == 1 and bool(receiver.accepted()), 30)
    finally:
        worker.close_unstarted()
    assert receiver.accepted()[0].headers["host"] == f"hooks.example:{port}"


def all_rows(sessions: sessionmaker[Session]) -> list[m.Delivery]:
    with sessions() as s:
        return list(s.scalars(select(m.Delivery)).all())


def test_credentials_in_a_webhook_url_are_sent_but_never_printed(
    store: tuple[str, Engine], receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    url, engine = store
    sessions = make_sessionmaker(engine)
    with_creds = receiver.url.replace("http://", "http://hook-user:s3cret-pw@") + "/hook"
    assert redact(with_creds) == receiver.url.replace("http://", "http://***@") + "/hook"
    subscribe(sessions, with_creds)
    queue(sessions, 1)
    worker = DeliveryWorker(sessions, fast(url), rnd=lambda: 0.0)
    caplog.set_level(logging.DEBUG)
    try:
        assert worker.run_once() == 1
    finally:
        worker.close_unstarted()
    (got,) = receiver.accepted()
    assert got.headers["authorization"].startswith("Basic ")
    assert "s3cret-pw" not in caplog.text
    assert [r.state for r in all_rows(sessions)] == [DELIVERED]
