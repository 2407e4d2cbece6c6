"""What announcing a command's change writes, and when: its event and deliveries at once,
the command's own row with the rest of the transaction.

A switch point that supersedes one on 1,000 nodes announces 1,000 changes in one
transaction. Each event used to flush the session, so each command's row was written by
an UPDATE of its own between two event inserts; now the events go in by Core and the
commands are written together at the commit. Counted with SQLAlchemy's cursor hook, on
both stores.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from scheduler_svc.fleet.events import CONFIG_KEY, FleetTargets, emit
from scheduler_svc.fleet.repositories import SubscriptionRepo
from scheduler_svc.fleet.types import EventType
from scheduler_svc.services.commands import transition
from scheduler_svc.store import models as m
from scheduler_svc.store.types import CommandState

N = 40


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


def test_an_event_goes_to_each_target_on_its_lane_with_the_columns_defaults(
    sessions: sessionmaker[Session],
) -> None:
    """A cluster-wide event's lane has no job; the fleet actions need no URL; a subject is
    cut to its column (253 characters) while the data keeps every name whole."""
    ids = _job_with_commands(sessions)
    long = "n" * 300
    flag = {"node": long, "device": "mlx5_1", "port": 1, "reason": "port flapped 5x"}
    with sessions(info={CONFIG_KEY: FleetTargets(k8s=True, slurm=True)}) as s, s.begin():
        emit(s, "io.railover.command.superseded", job_id="j", subject="c", data={"i": ids[0]})
        emit(s, EventType.MAINTENANCE_FLAG, job_id=None, subject=f"node/{long}", data=flag)
    with sessions() as s:
        events = list(s.scalars(select(m.OutboxEvent).order_by(m.OutboxEvent.id)))
        assert [len(e.subject) for e in events] == [1, 253]
        assert events[1].subject == f"node/{long}"[:253]
        assert events[1].data == flag
        rows = {
            (d.outbox_id, d.target, d.lane, d.url, d.state, d.attempts, d.claimed_by)
            for d in s.scalars(select(m.Delivery))
        }
    (sub,) = {t for _, t, *_ in rows if t.startswith("sub:")}
    assert rows == {
        (events[0].id, sub, f"{sub}|j", "https://fleet.example/hook", "pending", 0, None),
        (events[1].id, "k8s", "k8s|", "", "pending", 0, None),
        (events[1].id, "slurm", "slurm|", "", "pending", 0, None),
    }
