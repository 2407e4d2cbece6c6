"""Signed CloudEvents to a loopback receiver: order per job, retries, restart, dead letters."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import httpx
import pytest

from railover_testing.local import local_service
from railover_testing.waiting import wait_until
from scheduler_svc.fleet.signing import SIGNATURE_HEADER, SignatureError, verify
from tests.fleet.conftest import Received, Receiver
from tests.fleet.helpers import SECRET, fast, fault, subscribe, take_and_apply, two_jobs


def in_state(http: httpx.Client, state: str) -> list[dict[str, Any]]:
    deliveries: list[dict[str, Any]] = http.get(
        "/v1/deliveries", params={"state": state, "limit": 1000}
    ).json()["deliveries"]
    return deliveries


def pending(http: httpx.Client) -> list[dict[str, Any]]:
    return in_state(http, "pending")


def by_job(received: list[Received]) -> dict[str, list[dict[str, Any]]]:
    """First accepted copy of each event, grouped by job, in arrival order."""
    seen: set[str] = set()
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in received:
        e = r.event
        if e["id"] not in seen:
            seen.add(e["id"])
            out[e.get("partitionkey", "")].append(e)
    return out


def test_fault_sequence_arrives_signed_in_order_with_retries(
    db_url: str, receiver: Receiver
) -> None:
    attempts: dict[str, int] = defaultdict(int)

    def first_event_fails_three_times(e: dict[str, Any]) -> bool:
        attempts[e["id"]] += 1
        return e["sequence"] == "1" and attempts[e["id"]] <= 3

    receiver.fail = first_event_fails_three_times
    with local_service(fast(db_url)) as url, httpx.Client(base_url=url, timeout=30) as http:
        two_jobs(http)
        sub = subscribe(http, receiver.url)
        assert "secret" not in http.get(f"/v1/subscriptions/{sub['subscription_id']}").json()
        # Script: a fault on each job, the agents apply the commands, a second fault on j1.
        d1 = fault(http, "n0", "mlx5_0", 2000)
        d2 = fault(http, "n2", "mlx5_0", 2000)
        applied = take_and_apply(http, "n0")
        assert take_and_apply(http, "n2") >= 1 and applied >= 1
        d3 = fault(http, "n1", "mlx5_3", 2100)
        assert len(d1) == len(d2) == len(d3) == 1
        # Everything the outbox holds for the subscription, in outbox order.
        assert wait_until(lambda: not pending(http), timeout=20), "deliveries still pending"
        stored = http.get("/v1/deliveries", params={"limit": 1000}).json()["deliveries"]
    assert {d["state"] for d in stored} == {"delivered"}
    receiver.verify_all(SECRET)
    jobs = by_job(receiver.accepted())
    for job in ("j1", "j2"):
        # Every event of the job, once each, in the order it was stored.
        assert [e["id"] for e in jobs[job]] == [d["event_id"] for d in stored if d["job_id"] == job]
    j1 = [(e["type"], e["data"]) for e in jobs["j1"]]
    assert [d["decision_id"] for t, d in j1 if t.endswith("decision.created")] == d1 + d3
    kinds = [t.removeprefix("io.railover.") for t, _ in j1]
    decided_at = [i for i, k in enumerate(kinds) if k == "decision.created"]
    # The decision first; its commands reach n0 and are applied; then the second decision
    # (which may supersede commands of the first: those events follow it).
    assert decided_at[0] == 0
    on_n0 = [
        i for i, (_, d) in enumerate(j1) if d.get("node") == "n0" and d["decision_id"] == d1[0]
    ]
    assert [kinds[i] for i in on_n0] == ["command.delivered"] * applied + [
        "command.applied"
    ] * applied
    assert max(on_n0) < decided_at[1]
    # The first event was refused three times, then taken; nothing of j1 overtook it.
    first = [r for r in receiver.requests if r.event["sequence"] == "1"]
    assert [r.status for r in first] == [500, 500, 500, 200]
    j1_times = [r.at for r in receiver.accepted() if r.event.get("partitionkey") == "j1"]
    assert j1_times == sorted(j1_times)
    got = receiver.accepted()
    assert got[0].headers["content-type"] == "application/cloudevents+json"
    assert got[0].event["specversion"] == "1.0"
    assert got[0].event["source"] == "/railover/scheduler"


def test_outbox_survives_restart_without_loss_or_reordering(
    db_url: str, receiver: Receiver
) -> None:
    accepting = {"on": True}
    taken: list[str] = []

    def gate(e: dict[str, Any]) -> bool:
        # Take the first two events, then refuse everything: the rest stay in the outbox.
        if e["id"] in taken:
            return False
        if accepting["on"] and len(taken) < 2:
            taken.append(e["id"])
            return False
        return True

    receiver.fail = gate
    settings = fast(db_url)
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        two_jobs(http)
        subscribe(http, receiver.url, job_id="j1")
        # Primaries of four GPUs (their backups stay up): each fault moves one more rank.
        decisions = [fault(http, "n0", f"mlx5_{2 * d}", 2000 + d) for d in range(4)]
        assert all(len(d) == 1 for d in decisions)
        receiver.wait_for(2)
        accepting["on"] = False
    # Stopped with events still pending: a new instance on the same store carries on.
    receiver.fail = lambda _e: False
    with local_service(settings):
        got = receiver.wait_for(4)
    events = by_job(got)["j1"]
    assert [e["data"]["decision_id"] for e in events] == [d[0] for d in decisions]
    assert [int(e["sequence"]) for e in events] == sorted(int(e["sequence"]) for e in events)
    receiver.verify_all(SECRET)


def test_dead_letters_are_listed_and_replayed(db_url: str, receiver: Receiver) -> None:
    receiver.fail = lambda _e: True
    with (
        local_service(fast(db_url, webhook_max_attempts=2)) as url,
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        two_jobs(http)
        sub = subscribe(http, receiver.url, event_types=["io.railover.decision.created"])
        fault(http, "n0", "mlx5_0", 2000)
        fault(http, "n0", "mlx5_1", 2001)
        assert wait_until(lambda: len(in_state(http, "dead")) == 2, timeout=20)
        dead = in_state(http, "dead")
        assert {d["attempts"] for d in dead} == {2}
        assert dead[0]["last_status"] == 500 and dead[0]["target"] == (
            f"sub:{sub['subscription_id']}"
        )
        receiver.fail = lambda _e: False
        one = http.post(f"/v1/deliveries/{dead[0]['delivery_id']}/replay")
        assert one.status_code == 200 and one.json()["state"] == "pending"
        # No longer dead (pending, or already delivered): a second replay is a conflict.
        again = http.post(f"/v1/deliveries/{dead[0]['delivery_id']}/replay")
        assert again.status_code == 409
        assert again.json()["detail"].endswith("; only dead ones are replayed")
        rest = http.post("/v1/deliveries/replay", json={"target": dead[1]["target"]})
        assert rest.status_code == 200
        got = receiver.wait_for(2)
        assert [r.event["id"] for r in got][:2] == [d["event_id"] for d in dead]
        # The receiver has the request a moment before the worker records its answer.
        assert wait_until(lambda: len(in_state(http, "delivered")) == 2, timeout=20)


def test_signature_rejects_forgery_and_replay() -> None:
    from scheduler_svc.fleet.signing import sign

    body = b'{"id": "1"}'
    header = sign(SECRET, body, timestamp=1_000_000)
    assert verify(SECRET, header, body, now=1_000_100) == 1_000_000
    for bad_header, bad_body, now in (
        (header, b'{"id": "2"}', 1_000_100),  # body changed
        (sign("another-secret-0123456789", body, 1_000_000), body, 1_000_100),  # forged
        (header, body, 1_000_000 + 301),  # replayed too late
        (None, body, 1_000_000),
        ("t=x,v1=00", body, 1_000_000),
    ):
        with pytest.raises(SignatureError):
            verify(SECRET, bad_header, bad_body, now=now)
    assert SIGNATURE_HEADER == "Railover-Signature"


def test_notify_url_filters_and_metrics(db_url: str, receiver: Receiver) -> None:
    from tests.scheduler_svc.helpers import job_body, register_nodes

    notify_secret = "notify-secret-0123456789abcdef"
    settings = fast(db_url, notify_secret=notify_secret)
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        register_nodes(http, ["n0", "n1", "n2", "n3"])
        body = job_body("j1", ["n0", "n1"], notify_url=f"{receiver.url}/j1")
        assert http.post("/v1/jobs", json=body).status_code == 201
        assert http.post("/v1/jobs", json=job_body("j2", ["n2", "n3"])).status_code == 201
        # Only j2's command events: j1's decision must not reach this one.
        subscribe(
            http,
            f"{receiver.url}/j2-commands",
            job_id="j2",
            event_types=["io.railover.command.delivered"],
        )
        fault(http, "n0", "mlx5_0", 2000)
        fault(http, "n2", "mlx5_0", 2000)
        take_and_apply(http, "n2")
        got = receiver.wait_for(2)
        # Deliveries are stored with their events: once none is pending, all were sent.
        assert wait_until(lambda: not pending(http), timeout=20)
        scrape = http.get("/metrics").text
    assert len({r.event["id"] for r in receiver.accepted()}) == 2
    by_path = defaultdict(set)
    for r in receiver.accepted():
        by_path[r.path].add((r.event["type"], r.event.get("partitionkey")))
    # j1's notify_url: j1's events only; the filtered subscription: j2's deliveries only.
    assert by_path["/j1"] == {("io.railover.decision.created", "j1")}
    assert by_path["/j2-commands"] == {("io.railover.command.delivered", "j2")}
    for r in got:
        secret = notify_secret if r.event.get("partitionkey") == "j1" else SECRET
        verify(secret, r.headers["railover-signature"], r.body)
    assert 'railover_deliveries_total{result="delivered",target="webhook"}' in scrape
    assert 'railover_delivery_latency_seconds_count{target="webhook"}' in scrape


def test_example_receiver_verifies_and_deduplicates() -> None:
    from datetime import UTC, datetime

    from examples.webhook_receiver import Deduplicator, handle
    from scheduler_svc.fleet.events import to_cloudevent
    from scheduler_svc.fleet.signing import sign
    from scheduler_svc.store.models import OutboxEvent

    row = OutboxEvent(
        id=7,
        event_id="e-7",
        type="io.railover.decision.created",
        subject="decision/d",
        job_id="j1",
        data={"action": "failover", "reason": "cheaper"},
        created_at=datetime.now(UTC),
    )
    headers, body = to_cloudevent(row)
    headers[SIGNATURE_HEADER] = sign(SECRET, body)
    seen = Deduplicator()
    status, event = handle(headers, body, SECRET, seen)
    assert status == 200 and event is not None
    assert (event["job"], event["sequence"], event["data"]["action"]) == ("j1", "7", "failover")
    assert handle(headers, body, SECRET, seen) == (200, None)  # a redelivery
    assert handle(headers, body + b" ", SECRET, seen)[0] == 401
