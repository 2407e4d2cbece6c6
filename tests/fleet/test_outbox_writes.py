"""What announcing a command's change writes, and when: its event and deliveries at once,
the command's own row with the rest of the transaction.

A switch point that supersedes one on 1,000 nodes announces 1,000 changes in one
transaction. Each event used to flush the session, so each command's row was written by
an UPDATE of its own between two event inserts; now the events go in by Core and the
commands are written together at the commit. Counted with SQLAlchemy's cursor hook, on
both stores.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from scheduler_svc.fleet.repositories import SubscriptionRepo
from scheduler_svc.services.commands import transition
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.types import CommandState

N = 40


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    e = make_engine(db_url)
    yield e
    e.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)


def _job_with_commands(sessions: sessionmaker[Session]) -> list[int]:
    """A job, a subscription to its command events, and N delivered commands."""
    now = datetime.now(UTC)
    with sessions() as s, s.begin():
        SubscriptionRepo(s).create(
            url="https://fleet.example/hook",
            event_types=["io.railover.command.superseded"],
            job_id=None,
            description="",
            secret=None,
            created_by=None,
            now=now,
        )
        s.add(
            m.Job(
                job_id="j",
                created_at=now,
                checkpoint_interval_s=600.0,
                reload_s=60.0,
                detect_s=5.0,
                timeout_s=60.0,
                last_checkpoint_at=now,
            )
        )
        s.flush()
        rows = [
            m.Command(node=f"n{i}", job_id="j", kind="failover", state="delivered", created_at=now)
            for i in range(N)
        ]
        s.add_all(rows)
        s.flush()
        return [c.command_id for c in rows]


def test_superseding_many_commands_writes_each_event_once_and_the_commands_together(
    engine: Engine, sessions: sessionmaker[Session]
) -> None:
    ids = _job_with_commands(sessions)
    sent: list[list[str]] = []  # each statement's first three words
    event.listen(engine, "before_cursor_execute", lambda *a: sent.append(a[2].split()[:3]))
    order = list(reversed(ids))  # not the order the rows were made in
    now = datetime.now(UTC)
    with sessions() as s, s.begin():
        commands = {c.command_id: c for c in s.scalars(select(m.Command))}
        sent.clear()
        for cid in order:
            assert transition(s, commands[cid], CommandState.SUPERSEDED, now)
        # Announced, not yet written: no statement has touched the commands.
        assert not [q for q in sent if q[:2] == ["UPDATE", "commands"]]
    writes = [" ".join(q) for q in sent if q[0] in ("INSERT", "UPDATE", "DELETE")]
    assert writes.count("INSERT INTO outbox_events") == N
    assert writes.count("INSERT INTO deliveries") == N
    # The commands' rows: one statement for all of them (the ORM's executemany), last.
    assert writes[-1] == "UPDATE commands SET"
    assert len(writes) == 2 * N + 1

    with sessions() as s:
        assert set(s.scalars(select(m.Command.state))) == {"superseded"}
        events = list(s.scalars(select(m.OutboxEvent).order_by(m.OutboxEvent.id)))
        assert [e.data["command_id"] for e in events] == order
        assert {e.type for e in events} == {"io.railover.command.superseded"}
        assert len({e.event_id for e in events}) == N
        deliveries = list(s.scalars(select(m.Delivery).order_by(m.Delivery.id)))
        assert [d.outbox_id for d in deliveries] == [e.id for e in events]
        assert {(d.lane, d.state, d.attempts) for d in deliveries} == {
            (f"{deliveries[0].target}|j", "pending", 0)
        }
