"""Every query of the fleet module: subscriptions, outbox, deliveries, audit log."""

from __future__ import annotations

import secrets
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import and_, bindparam, delete, event, func, insert, or_, select, update
from sqlalchemy.orm import Session, SessionTransaction, aliased

from scheduler_svc.store import models as m
from scheduler_svc.store import plain

if TYPE_CHECKING:
    from sqlalchemy import Table

PENDING, DELIVERED, DEAD, CANCELLED = "pending", "delivered", "dead", "cancelled"
ACTION_TARGETS = ("k8s", "slurm")


@dataclass(frozen=True, slots=True)
class Target:
    """What an event's delivery needs of a subscription that wants it."""

    subscription_id: str
    url: str
    event_types: tuple[str, ...]


OUTBOX = cast("Table", m.OutboxEvent.__table__)
DELIVERIES = cast("Table", m.Delivery.__table__)
# Built once: a statement's cache key is computed once per object, and `add` runs for
# every command a switch point supersedes.
_ADD_EVENT = insert(OUTBOX).returning(OUTBOX.c.id)
_ADD_DELIVERIES = insert(DELIVERIES)
_SUBSCRIBED = m.Subscription.__table__.c
# Who wants a job's events: every event asks (built once, see store/commands.py).
_MATCHING = (
    select(_SUBSCRIBED.subscription_id, _SUBSCRIBED.url, _SUBSCRIBED.event_types)
    .where(or_(_SUBSCRIBED.job_id.is_(None), _SUBSCRIBED.job_id == bindparam("job_id")))
    .order_by(_SUBSCRIBED.subscription_id)
)

# session.info key: the subscriptions read in this transaction, by job (`matching`).
_MATCHING_KEY = "railover.subscriptions"


@event.listens_for(Session, "after_transaction_end")
def _forget_matching(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # the transaction itself, not a flush's or a savepoint's
        session.info.pop(_MATCHING_KEY, None)


class SubscriptionRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def create(
        self,
        *,
        url: str,
        event_types: list[str],
        job_id: str | None,
        description: str,
        secret: str | None,
        created_by: str | None,
        now: datetime,
    ) -> m.Subscription:
        row = m.Subscription(
            subscription_id=f"sub_{secrets.token_hex(8)}",
            url=url,
            secret=secret or secrets.token_urlsafe(32),
            event_types=sorted(set(event_types)),
            job_id=job_id,
            description=description,
            created_at=now,
            created_by=created_by,
        )
        self.s.add(row)
        self.s.flush()
        self.s.info.pop(_MATCHING_KEY, None)
        return row

    def get(self, subscription_id: str) -> m.Subscription | None:
        return self.s.get(m.Subscription, subscription_id)

    def all(self) -> Sequence[m.Subscription]:
        return self.s.scalars(select(m.Subscription).order_by(m.Subscription.created_at)).all()

    def matching(self, event_type: str, job_id: str | None) -> list[Target]:
        """Subscriptions that want this event: type filter empty or naming it, job unset or it.

        Every event asks (a switch point's commands each announce their state, one by one),
        so this is one Core query for what a delivery needs, remembered for the rest of the
        transaction: a subscription made meanwhile is another transaction's, and gets the
        events of the transactions that start after it."""
        cached: dict[str | None, list[Target]] = self.s.info.setdefault(_MATCHING_KEY, {})
        if job_id not in cached:
            cached[job_id] = [
                Target(row.subscription_id, row.url, tuple(row.event_types or ()))
                for row in plain.execute(self.s, _MATCHING, {"job_id": job_id}, flush=False)
            ]
        # The type filter is a JSON list: matched here rather than with backend-specific JSON SQL.
        return [t for t in cached[job_id] if not t.event_types or event_type in t.event_types]

    def delete(self, row: m.Subscription) -> None:
        self.s.execute(
            update(m.Delivery)
            .where(m.Delivery.target == f"sub:{row.subscription_id}", m.Delivery.state == PENDING)
            .values(state=CANCELLED)
        )
        self.s.delete(row)
        self.s.flush()
        self.s.info.pop(_MATCHING_KEY, None)


class OutboxRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def add(self, event: dict[str, Any], deliveries: list[dict[str, Any]]) -> int:
        """Insert one event (`outbox_events` columns) and its deliveries (`deliveries`
        columns but `outbox_id`) in the caller's transaction; returns the event's id, the
        order of events.

        By Core, on the session's connection: nothing else of the session is flushed, so
        the change an event announces (a command's new state) is written at the session's
        next flush (its commit at the latest), with the other changes pending, and not once
        per event. A switch point superseding a 1,000-node one announces 1,000 changes in
        one transaction."""
        conn = self.s.connection()
        outbox_id = int(conn.execute(_ADD_EVENT, event).scalar_one())
        if deliveries:
            conn.execute(_ADD_DELIVERIES, [{**d, "outbox_id": outbox_id} for d in deliveries])
        return outbox_id

    def event(self, outbox_id: int) -> m.OutboxEvent | None:
        return self.s.get(m.OutboxEvent, outbox_id)

    def events(self, ids: Sequence[int]) -> dict[int, m.OutboxEvent]:
        rows = self.s.scalars(select(m.OutboxEvent).where(m.OutboxEvent.id.in_(ids))).all()
        return {r.id: r for r in rows}

    def claim(
        self,
        *,
        worker: str,
        now: datetime,
        until: datetime,
        limit: int,
        actions: bool | None = None,
        busy_targets: Collection[str] | None = None,
    ) -> list[m.Delivery]:
        """Claim up to `limit` due deliveries, each the oldest pending one of its lane.

        Only a lane's head is ever handed out, so a lane (one target, one job)
        is delivered strictly in event order even with several replicas. On
        PostgreSQL, FOR UPDATE SKIP LOCKED lets replicas claim side by side: a
        head another replica is claiming right now is skipped, not waited for,
        and the claim (claimed_by + a lease) is committed before any network
        call, so no transaction stays open while a receiver is slow. A replica
        that dies mid-delivery leaves a lease that simply expires. SQLite takes
        its write lock at BEGIN (store/db.py), which serialises claims the same way.
        `actions`: only fleet actions (Kubernetes, Slurm), only webhooks, or (None) both.
        `busy_targets` given: at most one delivery per target, none of those named (the
        worker's in flight), so one slow receiver never holds more than one slot.
        """
        d = m.Delivery
        earlier = aliased(m.Delivery)
        head = ~(
            select(earlier.id)
            .where(earlier.lane == d.lane, earlier.state == PENDING, earlier.id < d.id)
            .exists()
        )
        kinds = (
            []
            if actions is None
            else [d.target.in_(ACTION_TARGETS) if actions else d.target.not_in(ACTION_TARGETS)]
        )
        if busy_targets:
            # In the query, not after it: a busy target's many due lanes would fill the
            # window of rows read and hide every other target's behind them.
            kinds.append(d.target.not_in(list(busy_targets)))
        query = (
            select(d)
            .where(
                *kinds,
                d.state == PENDING,
                d.next_attempt_at <= now,
                or_(d.claimed_until.is_(None), d.claimed_until < now),
                head,
            )
            .order_by(d.id)
            .limit(limit if busy_targets is None else limit * 4)
        )
        if self.s.get_bind().dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=True, of=d)
        rows = list(self.s.scalars(query).all())
        if busy_targets is not None:
            taken, first = set(busy_targets), []
            for r in rows:
                if r.target not in taken:
                    taken.add(r.target)
                    first.append(r)
            rows = first[:limit]
        for r in rows:
            r.claimed_by, r.claimed_until = worker, until
        self.s.flush()
        return rows

    def prune_finished(self, before: datetime, limit: int) -> int:
        """Delete up to `limit` deliveries finished (delivered, dead or cancelled) before
        `before`, then the events no delivery needs any more; returns deliveries deleted."""
        d = m.Delivery
        finished = func.coalesce(d.delivered_at, d.dead_at, d.created_at)
        ids = (
            select(d.id)
            .where(d.state.in_((DELIVERED, DEAD, CANCELLED)), finished < before)
            .limit(limit)
        )
        gone = _deleted(
            self.s.execute(
                delete(d)
                .where(d.id.in_(ids.scalar_subquery()))
                .execution_options(synchronize_session=False)
            )
        )
        orphans = (
            select(m.OutboxEvent.id)
            .where(
                m.OutboxEvent.created_at < before,
                ~select(d.id).where(d.outbox_id == m.OutboxEvent.id).exists(),
            )
            .limit(limit)
        )
        self.s.execute(
            delete(m.OutboxEvent)
            .where(m.OutboxEvent.id.in_(orphans.scalar_subquery()))
            .execution_options(synchronize_session=False)
        )
        return gone

    def bound_dead(self, keep: int, limit: int) -> int:
        """Delete the oldest dead letters beyond the newest `keep`; returns how many."""
        d = m.Delivery
        newest_kept = (
            select(d.id).where(d.state == DEAD).order_by(d.id.desc()).offset(keep).limit(1)
        ).scalar_subquery()
        ids = select(d.id).where(d.state == DEAD, d.id <= newest_kept).order_by(d.id).limit(limit)
        return _deleted(
            self.s.execute(
                delete(d)
                .where(d.id.in_(ids.scalar_subquery()))
                .execution_options(synchronize_session=False)
            )
        )

    def finish(self, delivery_id: int, worker: str, **values: object) -> bool:
        """Record an attempt's outcome, only if this worker still holds the claim."""
        result = self.s.execute(
            update(m.Delivery)
            .where(m.Delivery.id == delivery_id, m.Delivery.claimed_by == worker)
            .values(claimed_by=None, claimed_until=None, **values)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    def release(self, worker: str) -> None:
        """Hand back this worker's unfinished claims (on shutdown) so others need not wait."""
        self.s.execute(
            update(m.Delivery)
            .where(m.Delivery.claimed_by == worker, m.Delivery.state == PENDING)
            .values(claimed_by=None, claimed_until=None)
            .execution_options(synchronize_session=False)
        )

    def get(self, delivery_id: int) -> m.Delivery | None:
        return self.s.get(m.Delivery, delivery_id)

    def list(
        self,
        *,
        state: str | None,
        target: str | None,
        job_id: str | None,
        event_type: str | None,
        after_id: int,
        limit: int,
    ) -> list[tuple[m.Delivery, m.OutboxEvent]]:
        d, e = m.Delivery, m.OutboxEvent
        query = select(d, e).join(e, e.id == d.outbox_id).where(d.id > after_id)
        if state is not None:
            query = query.where(d.state == state)
        if target is not None:
            query = query.where(d.target == target)
        if job_id is not None:
            query = query.where(e.job_id == job_id)
        if event_type is not None:
            query = query.where(e.type == event_type)
        rows = self.s.execute(query.order_by(d.id).limit(limit)).all()
        return [(r[0], r[1]) for r in rows]

    def replay(self, ids: Sequence[int] | None, target: str | None, now: datetime) -> int:
        """Put dead deliveries back in their lanes, with a fresh attempt budget."""
        conds = [m.Delivery.state == DEAD]
        if ids is not None:
            conds.append(m.Delivery.id.in_(ids))
        if target is not None:
            conds.append(m.Delivery.target == target)
        result = self.s.execute(
            update(m.Delivery)
            .where(and_(*conds))
            .values(
                state=PENDING,
                attempts=0,
                next_attempt_at=now,
                dead_at=None,
                claimed_by=None,
                claimed_until=None,
            )
            .execution_options(synchronize_session=False)
        )
        return int(getattr(result, "rowcount", 0))


class AuditRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def add(self, entry: m.AuditEntry) -> None:
        self.s.add(entry)

    def prune(self, before: datetime, limit: int) -> int:
        """Delete up to `limit` entries older than `before`; returns how many."""
        ids = select(m.AuditEntry.id).where(m.AuditEntry.at < before).limit(limit)
        return _deleted(
            self.s.execute(
                delete(m.AuditEntry)
                .where(m.AuditEntry.id.in_(ids.scalar_subquery()))
                .execution_options(synchronize_session=False)
            )
        )

    def list(
        self, *, before_id: int | None, token_id: str | None, limit: int
    ) -> Sequence[m.AuditEntry]:
        query = select(m.AuditEntry)
        if before_id is not None:
            query = query.where(m.AuditEntry.id < before_id)
        if token_id is not None:
            query = query.where(m.AuditEntry.token_id == token_id)
        return self.s.scalars(query.order_by(m.AuditEntry.id.desc()).limit(limit)).all()


def _deleted(result: object) -> int:
    return int(getattr(result, "rowcount", 0) or 0)
