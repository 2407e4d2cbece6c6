"""Insert-unless-taken: how a replayed event, a second replica or a racing request finds
that a fault, decision, switch fault or flag already exists, without deciding twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from scheduler_svc.engine.fabric import FaultKind
from scheduler_svc.engine.state import Action, DecisionRecord
from scheduler_svc.services.reconciler import record_decision
from scheduler_svc.store import models as m
from scheduler_svc.store.faults import EventRepo, FaultRepo
from scheduler_svc.store.idempotency import insert_unless_taken
from scheduler_svc.store.jobs import DecisionRepo, JobRepo
from scheduler_svc.store.maintenance import MaintenanceRepo
from tests.sql_statements import statements

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def fault(
    device: str = "mlx5_0", port: int = 1, event_id: str = "e1", kind: str = FaultKind.LINK_DOWN
) -> m.Fault:
    return m.Fault(
        node="n0",
        device=device,
        port=port,
        kind=kind,
        opened_at=NOW,
        first_event_id=event_id,
        detail={},
    )


def count(session: Session, model: type[m.Base]) -> int:
    return session.scalar(select(func.count()).select_from(model)) or 0


def test_a_new_row_is_inserted_and_returned(session: Session) -> None:
    row = fault()
    assert insert_unless_taken(session, row) is row
    assert row.id is not None  # flushed: the database gave it its id
    assert session.scalars(select(m.Fault)).all() == [row]


def test_a_taken_key_returns_none_and_keeps_the_rest_of_the_transaction(
    session: Session,
) -> None:
    first = fault()
    assert FaultRepo(session).open_if_new(first) is first
    other = fault(device="mlx5_1")
    assert FaultRepo(session).open_if_new(other) is other
    duplicate = fault(event_id="e2")  # same component, still open
    assert FaultRepo(session).open_if_new(duplicate) is None
    # The collision changed nothing else: both earlier faults are still there, and the
    # session goes on working (a flush, another insert, a query).
    assert duplicate not in session
    session.flush()
    assert [f.first_event_id for f in session.scalars(select(m.Fault).order_by(m.Fault.id))] == [
        "e1",
        "e1",
    ]
    assert FaultRepo(session).open_if_new(fault(device="mlx5_2")) is not None
    assert count(session, m.Fault) == 3


def test_a_cleared_fault_frees_its_component(session: Session) -> None:
    repo = FaultRepo(session)
    first = repo.open_if_new(fault())
    assert first is not None
    # Only the kinds asked for clear: a fault of another kind on the port stays open.
    assert repo.clear("n0", "mlx5_0", 1, NOW, [FaultKind.COUNTER_ERRORS]) == []
    assert repo.open_on_component("n0", "mlx5_0", 1) is first
    (cleared,) = repo.clear("n0", "mlx5_0", 1, NOW + timedelta(seconds=5), [FaultKind.LINK_DOWN])
    assert cleared is first and cleared.cleared_at == NOW + timedelta(seconds=5)
    assert repo.open_on_component("n0", "mlx5_0", 1) is None
    again = fault(event_id="e3")
    assert repo.open_if_new(again) is again
    assert repo.open_on_component("n0", "mlx5_0", 1) is again
    # Cleared is not resolved: the old fault stays evidence until its clearing rule closes it.
    assert [f.first_event_id for f in repo.all()] == ["e3", "e1"]
    repo.close(cleared, NOW + timedelta(seconds=9), "cleared", None)
    assert [f.first_event_id for f in repo.all()] == ["e3"]
    assert [f.first_event_id for f in repo.all(open_only=False)] == ["e3", "e1"]


def job(job_id: str = "j1") -> m.Job:
    return m.Job(
        job_id=job_id,
        created_at=NOW,
        checkpoint_interval_s=3600,
        reload_s=600,
        detect_s=0,
        timeout_s=30,
        last_checkpoint_at=NOW,
    )


def decision(decision_id: str, trigger: str) -> m.Decision:
    return m.Decision(
        decision_id=decision_id,
        job_id="j1",
        seq=1,
        trigger=trigger,
        fault_id=None,
        action="restart",
        reason="r",
        inputs={},
        costs_s={},
        costs_gpu_s={},
        plan={},
        created_at=NOW,
    )


def test_one_decision_per_job_and_trigger(session: Session) -> None:
    JobRepo(session).add(job())
    repo = DecisionRepo(session)
    first = decision("d1", "fault:1")
    assert repo.add(first) is first
    with statements(session.get_bind().engine) as seen:
        assert first.saved_gpu_s == 0.0  # left to the column's default: set on the object too
    assert seen == []
    assert repo.add(decision("d2", "fault:1")) is None
    assert repo.add(decision("d3", "fault:2")) is not None
    assert sorted(d.decision_id for d in repo.for_job("j1")) == ["d1", "d3"]


def test_one_open_switch_fault_and_one_open_flag_per_component(session: Session) -> None:
    faults, flags = FaultRepo(session), MaintenanceRepo(session)

    def sw() -> m.SwitchFault:
        return m.SwitchFault(switch="leaf1", opened_at=NOW, nodes=["n0", "n1"], reason="r")

    assert faults.open_switch_fault(sw()) is not None
    assert faults.open_switch_fault(sw()) is None
    assert faults.clear_switch_fault("leaf1", NOW) is not None
    assert faults.clear_switch_fault("leaf1", NOW) is None
    assert faults.open_switch_fault(sw()) is not None
    assert len(faults.open_switch_faults()) == 1
    bare = m.SwitchFault(switch="leaf2", opened_at=NOW, reason="r")  # nodes: its default
    assert faults.open_switch_fault(bare) is bare
    assert bare.nodes == []
    session.expire_all()
    assert [(f.switch, f.nodes) for f in faults.open_switch_faults()] == [
        ("leaf1", ["n0", "n1"]),
        ("leaf2", []),
    ]

    def flag() -> m.MaintenanceFlag:
        return m.MaintenanceFlag(node="n0", device="mlx5_0", port=1, flagged_at=NOW, reason="r")

    def flagged() -> list[tuple[str, str, int]]:
        return [(f.node, f.device, f.port) for f in flags.open_flags()]

    first = flags.flag(flag())
    assert first is not None
    assert flags.flag(flag()) is None
    assert flagged() == [("n0", "mlx5_0", 1)]
    assert flags.clear_flag(first.id, NOW) is first
    assert flags.clear_flag(first.id, NOW) is None  # already cleared
    assert flagged() == []
    assert flags.flag(flag()) is not None
    assert flagged() == [("n0", "mlx5_0", 1)]


def event_row(event_id: str) -> dict[str, object]:
    return {
        "event_id": event_id,
        "node": "n0",
        "kind": "port_down",
        "device": "mlx5_0",
        "port": 1,
        "observed_at": NOW,
        "received_at": NOW,
        "payload": {},
    }


def test_events_are_inserted_once_by_id(session: Session) -> None:
    repo = EventRepo(session)
    assert repo.insert_new([]) == set()
    assert repo.insert_new([event_row("a"), event_row("b")]) == {"a", "b"}
    assert repo.insert_new([event_row("b"), event_row("c")]) == {"c"}
    # One event alone (a report's usual batch) goes by a statement of its own.
    assert repo.insert_new([event_row("d")]) == {"d"}
    assert repo.insert_new([event_row("d")]) == set()
    assert repo.count() == 4
    assert repo.count("n0") == 4
    assert repo.count("n9") == 0
    stored = session.get_one(m.Event, "d")
    assert (stored.node, stored.payload, stored.fault_id) == ("n0", event_row("d")["payload"], None)
    assert stored.observed_at == event_row("d")["observed_at"]


def test_an_insert_on_a_taken_key_is_compiled_once_and_typed_by_its_columns(
    session: Session,
) -> None:
    """The one-row inserts that find a taken key are text SQLAlchemy caches compiled (its
    dialects' own ON CONFLICT inserts have no cache key), their values bound by the
    columns' types: an aware time and a JSON document read back as given."""
    repo = FaultRepo(session)
    first = repo.open_if_new(fault(device="mlx5_4"))
    assert first is not None
    row = fault(device="mlx5_5")
    row.detail = {"wc_status": 12, "note": "ü"}
    assert repo.open_if_new(row) is row
    session.expire_all()
    read = session.get_one(m.Fault, row.id)
    assert (read.opened_at, read.detail) == (NOW, {"wc_status": 12, "note": "ü"})
    assert read.cleared_at is None and read.last_error_at is None
    cached = []

    def seen(*args: Any) -> None:  # before_cursor_execute(conn, cursor, sql, params, context, many)
        if args[2].startswith("INSERT INTO faults") and "ON CONFLICT" in args[2]:
            cached.append(args[4].cache_hit)

    engine = session.get_bind().engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        assert repo.open_if_new(fault(device="mlx5_7")) is not None
        assert repo.open_if_new(fault(device="mlx5_7", event_id="again")) is None
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert [str(c) for c in cached] == ["CacheStats.CACHE_HIT"] * 2


def test_evidence_that_changes_the_outcome_again_extends_the_history(session: Session) -> None:
    """The same trigger deciding again (the fault came back, say) is stored under the
    trigger and the job's next decision number, each entry once."""
    row = job()
    JobRepo(session).add(row)
    made = [
        record_decision(
            session,
            row,
            DecisionRecord("fault:7", Action.FAILOVER, "r", {}, {}, {}, {}, "fault:7"),
            NOW + timedelta(seconds=i),
        )
        for i in range(3)
    ]
    assert [d.trigger for d in made] == ["fault:7", "fault:7#2", "fault:7#3"]
    assert [d.seq for d in made] == [1, 2, 3]
    assert row.decision_count == 3
    assert [d.fault_id for d in made] == [7, 7, 7]
    stored = sorted((d.seq, d.trigger) for d in DecisionRepo(session).for_job(row.job_id))
    assert stored == [(1, "fault:7"), (2, "fault:7#2"), (3, "fault:7#3")]
