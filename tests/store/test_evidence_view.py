"""The evidence held in memory (store/evidence_view.py) is the store's, whoever wrote it.

Random sequences of evidence writes (faults opened, refreshed and closed, port levels,
quarantine flags, switch failures, maintenance windows), each committed or rolled back by
one of three engines on one store: two that keep a view (two replicas) and one that keeps
none (the CLI, another process), some by the ORM, some by Core or text, one by a raw
connection. After every step each view's evidence on several sets of nodes equals a read
of the store; inside a transaction that wrote, its own writes are read too.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, delete, event, insert, select, text, update
from sqlalchemy.orm import Session

from railover_testing.cluster_shapes import dual_port_node
from scheduler_svc.engine import fabric as health
from scheduler_svc.services import fabric
from scheduler_svc.store import evidence_view
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker, upgrade
from scheduler_svc.store.faults import FaultRepo
from scheduler_svc.store.nodes import NodeRepo
from tests.conftest import truncate_pg

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
NODES = ("n0", "n1", "n2", "n3")
DEVICES = ("mlx5_0", "mlx5_1")
# A few nodes first: the first read after another engine's commit reads the store whole.
WANTED: tuple[tuple[str, ...] | None, ...] = (("n0",), ("n1", "n2"), NODES, None)
EVIDENCE = ("faults", "maintenance_flags", "switch_faults", "maintenance_windows")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Engine]]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'railover.db'}"
        upgrade(url)
    else:
        url = request.getfixturevalue("pg_url")
        truncate_pg(url)
    made = {name: make_engine(url) for name in ("a", "b", "cli")}
    evidence_view.attach(made["a"])
    evidence_view.attach(made["b"])
    with Session(made["cli"]) as s, s.begin():
        for node in NODES:
            body = dual_port_node()
            NodeRepo(s).replace_topology(node, body["gpus"], body["rnics"], NOW)
    yield made
    for engine in made.values():
        engine.dispose()


def empty(engine: Engine) -> None:
    """No evidence left, every port up, by the engine that keeps no view: as the driver's
    own SQL (no parameters to name a node), by TRUNCATE where the store has it."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(f"TRUNCATE {', '.join(EVIDENCE)}")
        else:
            for table in EVIDENCE:
                conn.exec_driver_sql(f"DELETE FROM {table}")
        conn.execute(update(m.Rnic).values(state="ACTIVE", observed_at=None))


def read_both(s: Session, wanted: tuple[str, ...] | None) -> tuple[Any, Any]:
    held, held_rows = fabric.evidence(s, wanted)
    stored, stored_rows = fabric.evidence(s, wanted, from_store=True)
    return (held, held_rows), (stored, stored_rows)


def assert_same(engine: Engine, step: int) -> None:
    """The view's evidence on each set of nodes is the store's, and on a set of nodes it is
    the fleet's kept to those nodes (switch failures and switch-wide windows stay)."""
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        assert evidence_view.view_of(s) is not None
        seen = {}
        for wanted in WANTED:
            held, stored = read_both(s, wanted)
            assert held == stored, f"step {step}, nodes {wanted}: the view differs from the store"
            seen[wanted] = held[0]
        everywhere = seen[None]
        # What is open, as the tables say: the evidence names each of it once.
        open_ = {
            "faults": select(m.Fault.id).where(m.Fault.resolved_at.is_(None)),
            "quarantines": select(m.MaintenanceFlag.id).where(
                m.MaintenanceFlag.cleared_at.is_(None)
            ),
            "switches": select(m.SwitchFault.id).where(m.SwitchFault.cleared_at.is_(None)),
            "maintenance": select(m.MaintenanceWindow.id).where(
                m.MaintenanceWindow.phase != "done"
            ),
        }
        for part, ids in open_.items():
            named = sorted(x.id for x in getattr(everywhere, part))
            assert named == sorted(s.scalars(ids)), f"step {step}: {part} not as stored"
        for wanted, held_evidence in seen.items():
            if wanted is not None:
                on = set(wanted)
                assert held_evidence == health.Evidence(
                    faults=tuple(f for f in everywhere.faults if f.node in on),
                    switches=everywhere.switches,
                    quarantines=tuple(q for q in everywhere.quarantines if q.node in on),
                    maintenance=tuple(
                        w for w in everywhere.maintenance if w.switch is not None or w.node in on
                    ),
                ), f"step {step}: the evidence on {wanted} is not the fleet's on those nodes"


# One write: (how, node index, device index, port, a choice among open rows).
WRITES = st.tuples(
    st.sampled_from(
        [
            "open",
            "open_core",
            "level_down",
            "level_up",
            "levels_core",
            "refresh",
            "close",
            "flag",
            "unflag",
            "switch",
            "unswitch",
            "window",
            "window_done",
        ]
    ),
    st.integers(0, len(NODES) - 1),
    st.integers(0, len(DEVICES) - 1),
    st.integers(1, 2),
    st.integers(0, 7),
)
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "cli", "raw", "stamp gone"]),  # who writes
        st.lists(WRITES, min_size=1, max_size=3),  # in one transaction
        st.sampled_from(["commit", "commit", "rollback", "read-then-commit", "read-then-rollback"]),
    ),
    min_size=1,
    max_size=12,
)


def write(s: Session, op: tuple[str, str, str, int, int], t: datetime) -> None:
    """One write `op`: (how, node, device, port, a choice among open rows), at `t`."""
    how, node, device, port, pick = op
    faults = FaultRepo(s)
    if how in ("open", "open_core"):
        row = m.Fault(
            node=node,
            device=device,
            port=port,
            kind="link_down",
            opened_at=t,
            first_event_id=f"{node}-{device}-{port}-{t.timestamp()}",
            detail={},
        )
        if how == "open":
            faults.open_if_new(row)  # the report's INSERT ... ON CONFLICT, as text
        elif not any(
            (f.node, f.device, f.port) == (node, device, port) for f in faults.unresolved()
        ):
            s.add(row)  # an ORM INSERT; one open fault a port
            s.flush()
    elif how in ("level_down", "level_up"):
        NodeRepo(s).observe_port(node, device, port, "DOWN" if how == "level_down" else "ACTIVE", t)
    elif how == "levels_core":  # one device on every node: a write naming no node
        s.execute(update(m.Rnic).where(m.Rnic.name == device).values(state="DOWN", observed_at=t))
    elif how in ("refresh", "close"):
        open_ = faults.unresolved()
        if open_:
            row = open_[pick % len(open_)]
            if how == "refresh":
                row.last_error_at = t
            else:
                faults.close(row, t, "cleared", None)
            s.flush()
    elif how == "flag":
        s.add(m.MaintenanceFlag(node=node, device=device, port=port, flagged_at=t, reason="flaps"))
    elif how == "unflag":
        flags = s.scalars(select(m.MaintenanceFlag).where(m.MaintenanceFlag.cleared_at.is_(None)))
        for i, flag in enumerate(flags):
            if i == pick % 3:
                flag.cleared_at = t
    elif how == "switch":
        faults.open_switch_fault(
            m.SwitchFault(switch=f"leaf-{port}", opened_at=t, nodes=[node], reason="lost")
        )
    elif how == "unswitch":
        s.execute(
            update(m.SwitchFault).values(cleared_at=t).where(m.SwitchFault.id % 2 == pick % 2)
        )
    elif how == "window":
        s.add(
            m.MaintenanceWindow(
                node=node,
                start_at=t,
                end_at=t + timedelta(hours=1),
                moves_at=t,
                reason="swap",
                created_at=t,
            )
        )
    else:
        s.execute(
            update(m.MaintenanceWindow)
            .values(phase="done")
            .where(m.MaintenanceWindow.id % 3 == pick % 3)
        )
    s.flush()


def raw_write(engine: Engine, node: str, t: datetime) -> None:
    """Writes by a plain connection, no session: a fault opened on a port unless one is,
    then, in a transaction of its own, the port's level as text indented as a template
    writes it."""
    with engine.begin() as conn:
        taken = conn.execute(
            select(m.Fault.id).where(
                m.Fault.node == node,
                m.Fault.device == "mlx5_0",
                m.Fault.port == 1,
                m.Fault.resolved_at.is_(None),
            )
        ).first()
        if taken is None:
            conn.execute(
                insert(m.Fault).values(
                    node=node,
                    device="mlx5_0",
                    port=1,
                    kind="link_down",
                    opened_at=t,
                    first_event_id=f"raw-{node}-{t.timestamp()}",
                    detail={},
                )
            )
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                UPDATE rnics SET state = 'DOWN', observed_at = :at
                WHERE node = :node AND name = 'mlx5_0'
                """
            ),
            {"at": t, "node": node},
        )


@given(steps=STEPS)
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_view_reads_what_the_store_holds(engines: dict[str, Engine], steps: Any) -> None:
    empty(engines["cli"])
    clock = itertools.count(1)
    for step, (who, writes, end) in enumerate(steps):
        t = NOW + timedelta(seconds=next(clock))
        if who == "raw":
            raw_write(engines["cli"], NODES[writes[0][1]], t)
        elif who == "stamp gone":  # a store emptied by hand: no view may hold until a write
            with engines["cli"].begin() as conn:
                conn.execute(delete(m.EvidenceStamp))
        else:
            with make_sessionmaker(engines[who])() as s, s.begin():
                for how, n, d, port, pick in writes:
                    write(s, (how, NODES[n], DEVICES[d], port, pick), t)
                if end.startswith("read-then"):  # its own writes, with what others hold
                    for wanted in WANTED:
                        held, stored = read_both(s, wanted)
                        assert held == stored, f"step {step}: its own writes not read"
                if end.endswith("rollback"):
                    s.rollback()
        for name in ("a", "b"):
            assert_same(engines[name], step)


def test_a_view_reads_again_only_the_nodes_its_own_commits_changed(
    engines: dict[str, Engine],
) -> None:
    """After a commit of its own engine on one node, a view reads that node's faults and
    nothing else again; after another engine's commit, everything."""
    empty(engines["cli"])
    sessions = make_sessionmaker(engines["a"])

    def evidence_statements() -> list[str]:
        seen: list[str] = []

        def sent(*args: Any) -> None:
            sql = " ".join(args[2].split())
            if "FROM faults" in sql or "FROM maintenance" in sql or "FROM switch" in sql:
                table = sql.split(" WHERE ")[0].split(" FROM ")[1].split()[0]
                seen.append(table + (" on some nodes" if " IN (" in sql else ""))

        event.listen(engines["a"], "before_cursor_execute", sent)
        try:
            with sessions() as s, s.begin():
                fabric.evidence(s, None)
        finally:
            event.remove(engines["a"], "before_cursor_execute", sent)
        return seen

    assert evidence_statements() == [
        "faults",
        "maintenance_flags",
        "switch_faults",
        "maintenance_windows",
    ]  # first read: whole
    assert evidence_statements() == []  # held
    with sessions() as s, s.begin():
        write(s, ("open", "n1", "mlx5_0", 1, 0), NOW)
    assert evidence_statements() == ["faults on some nodes"]  # n1's
    assert evidence_statements() == []
    with sessions() as s, s.begin():  # the fault by its id: the view knows its node
        write(s, ("refresh", "n1", "mlx5_0", 1, 0), NOW + timedelta(seconds=1))
    assert evidence_statements() == ["faults on some nodes"]
    with make_sessionmaker(engines["cli"])() as s, s.begin():
        write(s, ("flag", "n2", "mlx5_1", 1, 0), NOW)
    assert evidence_statements() == [
        "faults",
        "maintenance_flags",
        "switch_faults",
        "maintenance_windows",
    ]


def test_what_a_view_keeps_across_rollbacks_unread_nodes_and_writes_it_did_not_see(
    engines: dict[str, Engine],
) -> None:
    """The sequences a random run meets rarely, each checked against the store:

    - a write by a fault's id on an engine whose view has read nothing yet;
    - a transaction's own reads of what it then rolls back, with the view current and
      with the view behind another engine's commit: neither is kept;
    - two commits on two nodes with no read between: both nodes are read again;
    - a node held but never asked for, changed: read again without its values built;
    - a change by the driver's own connection, which no hook sees: the view goes on
      holding what it had (README: such a change must move the stamp), and a read with
      `from_store` sees the change."""
    empty(engines["cli"])
    with make_sessionmaker(engines["cli"])() as s, s.begin():
        for node in NODES:
            write(s, ("open", node, "mlx5_0", 1, 0), NOW)
    fresh = make_engine(str(engines["a"].url))
    evidence_view.attach(fresh)
    try:
        with make_sessionmaker(fresh)() as s, s.begin():  # by id, nothing read yet
            write(s, ("refresh", "n0", "mlx5_0", 1, 0), NOW + timedelta(seconds=1))
        assert_same(fresh, 0)
    finally:
        fresh.dispose()
    a, cli = make_sessionmaker(engines["a"]), make_sessionmaker(engines["cli"])
    assert_same(engines["a"], 1)
    for behind in (False, True):
        if behind:
            with cli() as s, s.begin():
                write(s, ("flag", "n3", "mlx5_1", 1, 0), NOW)
        with a() as s, s.begin():
            write(s, ("open", "n1", "mlx5_1", 2, 0), NOW + timedelta(seconds=2))
            write(s, ("flag", "n1", "mlx5_1", 2, 0), NOW + timedelta(seconds=2))
            held, stored = read_both(s, None)
            assert held == stored
            assert any(f.node == "n1" and f.device == "mlx5_1" for f in held[1])
            s.rollback()
        assert_same(engines["a"], 2)
    with a() as s, s.begin():  # its own write naming no node: every node read from the store
        write(s, ("levels_core", "n0", "mlx5_0", 1, 0), NOW + timedelta(seconds=2))
        held, stored = read_both(s, None)
        assert held == stored
        assert all(f.state == "DOWN" for f in held[1] if f.device == "mlx5_0")
        s.rollback()
    for node in ("n1", "n2"):  # two commits, no read between
        with a() as s, s.begin():
            write(s, ("open", node, "mlx5_1", 1, 0), NOW + timedelta(seconds=3))
    assert_same(engines["a"], 3)
    with cli() as s, s.begin():  # the next read is whole: on n0 only, n3's values unbuilt
        write(s, ("flag", "n2", "mlx5_0", 2, 0), NOW)
    with a() as s, s.begin():
        fabric.evidence(s, ["n0"])
    with a() as s, s.begin():
        write(s, ("close", "n3", "mlx5_0", 1, 3), NOW + timedelta(seconds=4))
    assert_same(engines["a"], 4)
    with engines["cli"].begin() as conn:  # the driver's own SQL, one statement on its own
        if engines["cli"].dialect.name == "postgresql":
            conn.exec_driver_sql("TRUNCATE maintenance_flags")
        else:
            conn.exec_driver_sql("DELETE FROM maintenance_flags")
    assert_same(engines["a"], 5)
    # By hand, past every hook: a fault closed with the driver's own connection.
    raw = engines["cli"].raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("UPDATE faults SET resolved_at = opened_at WHERE node = 'n0'")
        raw.commit()
    finally:
        raw.close()
    with a() as s, s.begin():
        held, _ = fabric.evidence(s, ["n0"])
        stored, _ = fabric.evidence(s, ["n0"], from_store=True)
    assert [f.node for f in held.faults] == ["n0"] and stored.faults == ()
