"""Subscriptions, dead letters and the audit log, as the API manages them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from scheduler_svc.errors import Conflict, NotFound
from scheduler_svc.fleet.events import WROTE_KEY
from scheduler_svc.fleet.outbound import redact
from scheduler_svc.fleet.repositories import DEAD, OutboxRepo, SubscriptionRepo
from scheduler_svc.fleet.schemas import (
    DeliveryOut,
    SubscriptionCreated,
    SubscriptionIn,
    SubscriptionOut,
)
from scheduler_svc.store import models as m


def subscription_out(row: m.Subscription) -> SubscriptionOut:
    return SubscriptionOut(
        subscription_id=row.subscription_id,
        url=redact(row.url),
        event_types=list(row.event_types),
        job_id=row.job_id,
        description=row.description,
        created_at=row.created_at,
        created_by=row.created_by,
    )


def create_subscription(
    session: Session, body: SubscriptionIn, created_by: str | None, now: datetime
) -> SubscriptionCreated:
    row = SubscriptionRepo(session).create(
        url=str(body.url),
        event_types=[t.value for t in body.event_types],
        job_id=body.job_id,
        description=body.description,
        secret=body.secret,
        created_by=created_by,
        now=now,
    )
    return SubscriptionCreated(**subscription_out(row).model_dump(), secret=row.secret)


def get_subscription(session: Session, subscription_id: str) -> m.Subscription:
    row = SubscriptionRepo(session).get(subscription_id)
    if row is None:
        raise NotFound(f"subscription {subscription_id!r} does not exist")
    return row


def delete_subscription(session: Session, subscription_id: str) -> None:
    """Delete it; its undelivered events are cancelled, not sent."""
    SubscriptionRepo(session).delete(get_subscription(session, subscription_id))


def delivery_out(d: m.Delivery, e: m.OutboxEvent) -> DeliveryOut:
    return DeliveryOut(
        delivery_id=d.id,
        target=d.target,
        url=redact(d.url),
        state=d.state,
        attempts=d.attempts,
        next_attempt_at=d.next_attempt_at,
        last_status=d.last_status,
        last_error=d.last_error,
        created_at=d.created_at,
        delivered_at=d.delivered_at,
        dead_at=d.dead_at,
        event_id=e.event_id,
        event_type=e.type,
        job_id=e.job_id,
        subject=e.subject,
        sequence=e.id,
    )


def replay_one(session: Session, delivery_id: int, now: datetime) -> DeliveryOut:
    repo = OutboxRepo(session)
    row = repo.get(delivery_id)
    if row is None:
        raise NotFound(f"delivery {delivery_id} does not exist")
    if row.state != DEAD:
        raise Conflict(f"delivery {delivery_id} is {row.state}; only dead ones are replayed")
    replay(session, [delivery_id], None, now)
    session.refresh(row)
    event = repo.event(row.outbox_id)
    assert event is not None  # the foreign key guarantees it
    return delivery_out(row, event)


def replay(session: Session, ids: Sequence[int] | None, target: str | None, now: datetime) -> int:
    """Back into their lanes, in their original order, with a fresh attempt budget."""
    count = OutboxRepo(session).replay(ids, target, now)
    if count:
        session.info[WROTE_KEY] = True  # wake this replica's worker on commit
    return count
