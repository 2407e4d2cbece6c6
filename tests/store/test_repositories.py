"""Repositories against both backends, each test in a transaction rolled back afterwards."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from railover_testing.cluster_shapes import dual_port_node, hgx_node
from scheduler_svc.engine import fabric as health
from scheduler_svc.services import fabric
from scheduler_svc.services.commands import transition
from scheduler_svc.services.targets import registered_ports
from scheduler_svc.store import models as m
from scheduler_svc.store.commands import CommandRepo
from scheduler_svc.store.coordination import CoordinationRepo, ProgressSample
from scheduler_svc.store.faults import FaultRepo, OpenFault
from scheduler_svc.store.jobs import JobRepo
from scheduler_svc.store.nodes import NodeRepo
from scheduler_svc.store.tokens import TOKEN_PREFIX, TokenRepo, hash_secret
from scheduler_svc.store.types import WAITING, CommandState, FaultKind
from tests.sql_statements import statements

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def test_tokens_are_stored_hashed_and_found_until_revoked(session: Session) -> None:
    repo = TokenRepo(session)
    row, plain = repo.create(role="agent", node="n0", description="rack 3", now=NOW)
    assert plain.startswith(f"{TOKEN_PREFIX}_{row.token_id}_")
    assert row.secret_sha256 == hash_secret(plain) != plain
    assert repo.by_plain(plain, NOW) is row
    assert repo.by_plain(plain + "x", NOW) is None
    other, _ = repo.create(role="fleet", node=None, description="", now=NOW + timedelta(1))
    assert repo.count_active(NOW) == 2
    assert [t.token_id for t in repo.all()] == [row.token_id, other.token_id]
    assert repo.revoke(row.token_id, NOW) is True
    assert repo.revoke(row.token_id, NOW) is False  # already revoked
    assert repo.by_plain(plain, NOW) is None
    assert repo.count_active(NOW) == 1


def test_an_expired_token_stops_working_at_its_expiry(session: Session) -> None:
    repo = TokenRepo(session)
    expires = NOW + timedelta(hours=1)
    row, plain = repo.create(role="agent", node="n0", description="", now=NOW, expires_at=expires)
    assert repo.by_plain(plain, expires - timedelta(seconds=1)) is row
    assert repo.count_active(expires - timedelta(seconds=1)) == 1
    assert repo.by_plain(plain, expires) is None  # expiry is exclusive
    assert repo.count_active(expires) == 0


def rows(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return body["gpus"], body["rnics"]


def test_dual_port_topology_is_stored_port_by_port(session: Session) -> None:
    repo = NodeRepo(session)
    node, changed = repo.replace_topology("n0", *rows(dual_port_node()), NOW)
    assert changed and node.topology_version == 1
    assert [(r.name, r.port) for r in node.rnics[:3]] == [
        ("mlx5_0", 1),
        ("mlx5_0", 2),
        ("mlx5_1", 1),
    ]
    assert node.gpus[0].pci == "10000:17:00.0"
    # The same topology again: nothing changes, the version stays.
    node, changed = repo.replace_topology("n0", *rows(dual_port_node()), NOW + timedelta(1))
    assert (changed, node.topology_version) == (False, 1)
    # Another shape on the same node: replaced, the version moves on.
    node, changed = repo.replace_topology("n0", *rows(hgx_node()), NOW + timedelta(2))
    assert (changed, node.topology_version) == (True, 2)
    assert len(node.rnics) == 8
    assert repo.versions(["n0", "n9"]) == {"n0": (2, NOW)}


def test_port_state_of_one_port_or_the_whole_card(session: Session) -> None:
    """A report sets one port's level or every port's of the card, and says which ports
    took it and the switch each is cabled to (a fault opened on them names it)."""
    repo = NodeRepo(session)
    repo.replace_topology("n0", *rows(dual_port_node()), NOW)
    assert repo.observe_port("n0", "mlx5_0", 2, "DOWN", NOW) == [(2, "rail1-leaf")]
    session.expire_all()
    states = {(r.name, r.port): r.state for r in repo.get("n0").rnics}  # type: ignore[union-attr]
    assert (states[("mlx5_0", 1)], states[("mlx5_0", 2)]) == ("ACTIVE", "DOWN")
    # Device fatal: every port.
    assert repo.observe_port("n0", "mlx5_1", None, "DOWN", NOW) == [
        (1, "rail2-leaf"),
        (2, "rail3-leaf"),
    ]
    session.expire_all()
    states = {(r.name, r.port): r.state for r in repo.get("n0").rnics}  # type: ignore[union-attr]
    assert (states[("mlx5_1", 1)], states[("mlx5_1", 2)]) == ("DOWN", "DOWN")
    assert sorted(repo.get_many(["n0", "n1"])) == ["n0"]
    # A card's report older than one port's newest: the other port's level only.
    later = NOW + timedelta(seconds=5)
    assert repo.observe_port("n0", "mlx5_2", 1, "ACTIVE", later + timedelta(seconds=5))
    assert repo.observe_port("n0", "mlx5_2", None, "DOWN", later) == [(2, "rail5-leaf")]
    assert repo.observe_port("n0", "mlx5_9", None, "DOWN", later) == []  # no such card


def test_a_port_report_older_than_its_level_changes_nothing(session: Session) -> None:
    repo = NodeRepo(session)
    repo.replace_topology("n0", *rows(dual_port_node()), NOW)
    later = NOW + timedelta(seconds=5)
    assert repo.observe_port("n0", "mlx5_0", 1, "DOWN", later)
    # An up observed before the down arrives after it: history, the port stays down.
    assert repo.observe_port("n0", "mlx5_0", 1, "ACTIVE", NOW) == []
    assert levels(session)[("n0", "mlx5_0", 1)] == ("DOWN", later)
    # Observed at the same time, the later report stands; a newer one always does.
    assert repo.observe_port("n0", "mlx5_0", 1, "ACTIVE", later)
    assert repo.observe_port("n0", "mlx5_0", 1, "DOWN", later + timedelta(seconds=1))
    assert levels(session)[("n0", "mlx5_0", 1)] == ("DOWN", later + timedelta(seconds=1))
    assert levels(session)[("n0", "mlx5_0", 2)] == ("ACTIVE", None)  # never reported


def levels(session: Session) -> dict[tuple[str, str, int], tuple[str, datetime | None]]:
    """Every registered port's level: (state, when observed)."""
    rows = session.execute(
        select(m.Rnic.node, m.Rnic.name, m.Rnic.port, m.Rnic.state, m.Rnic.observed_at)
    )
    return {(n, d, p): (st, at) for n, d, p, st, at in rows.tuples()}


def open_fault(session: Session, node: str, device: str, port: int, kind: str) -> m.Fault:
    row = m.Fault(
        node=node,
        device=device,
        port=port,
        kind=kind,
        opened_at=NOW,
        first_event_id=f"{node}-{device}-{port}",
        detail={},
    )
    assert FaultRepo(session).open_if_new(row) is row
    return row


def test_open_faults_are_read_with_the_level_of_the_port_each_names(session: Session) -> None:
    """Each open fault beside its port's level, in one statement: a whole device's fault
    reads port 1; a fault naming no registered port (a GPU's) reads none; a resolved fault
    is not read; `nodes` limits the faults, and no port of another node joins them. In
    the order the faults were opened, however the store keeps them."""
    nodes = NodeRepo(session)
    for node in ("n0", "n1"):
        nodes.replace_topology(node, *rows(dual_port_node()), NOW)
    later = NOW + timedelta(seconds=5)
    assert nodes.observe_port("n0", "mlx5_1", 2, "DOWN", later)
    assert nodes.observe_port("n1", "mlx5_1", 2, "INIT", later)  # same port, other node
    assert nodes.observe_port("n0", "mlx5_3", 1, "DOWN", later)
    link = open_fault(session, "n0", "mlx5_1", 2, FaultKind.LINK_DOWN)
    whole = open_fault(session, "n0", "mlx5_3", 0, FaultKind.RNIC_LOST)
    gpu = open_fault(session, "n0", "GPU-7", 0, FaultKind.GPU_LOST)
    elsewhere = open_fault(session, "n1", "mlx5_0", 1, FaultKind.LINK_DOWN)
    closed = open_fault(session, "n0", "mlx5_0", 1, FaultKind.LINK_DOWN)
    FaultRepo(session).close(closed, later, "port up past the damping", None)
    link.last_error_at = later  # PostgreSQL writes the row anew, after the others
    session.flush()
    faults = FaultRepo(session)

    def level(f: OpenFault) -> tuple[int, str | None, datetime | None]:
        return f.id, f.state, f.observed_at

    assert [level(f) for f in faults.unresolved_at_their_ports(["n0"])] == [
        (link.id, "DOWN", later),
        (whole.id, "DOWN", later),
        (gpu.id, None, None),
    ]
    everywhere = faults.unresolved_at_their_ports()
    assert [f.id for f in everywhere] == [link.id, whole.id, gpu.id, elsewhere.id]
    assert level(everywhere[-1]) == (elsewhere.id, "ACTIVE", None)
    assert [f.id for f in everywhere] == [f.id for f in faults.unresolved()]
    for read, row in zip(everywhere, faults.unresolved(), strict=True):  # the row's own values
        values = read._asdict()
        del values["state"], values["observed_at"]
        assert values == {name: getattr(row, name) for name in values}


def test_a_fault_read_as_evidence_is_described_without_a_statement(session: Session) -> None:
    """A decision's CloudEvent names its fault: from the open faults the same transaction
    read last, without a statement; from one read by its key where that read cannot
    answer (a fault it did not read, a read in a savepoint since rolled back)."""
    NodeRepo(session).replace_topology("n0", *rows(dual_port_node()), NOW)
    link = open_fault(session, "n0", "mlx5_1", 2, FaultKind.LINK_DOWN)
    other = open_fault(session, "n1", "mlx5_0", 1, FaultKind.LINK_DOWN)
    session.flush()
    faults = FaultRepo(session)
    faults.unresolved_at_their_ports(["n0"])
    with statements(session.get_bind().engine) as seen:
        assert faults.described(link.id) == ("n0", "mlx5_1", 2, FaultKind.LINK_DOWN.value)
    assert seen == []
    with statements(session.get_bind().engine) as seen:
        assert faults.described(other.id) == ("n1", "mlx5_0", 1, FaultKind.LINK_DOWN.value)
        assert faults.described(other.id + 100) is None  # no such fault
    assert len(seen) == 2
    savepoint = session.begin_nested()
    faults.unresolved_at_their_ports()
    savepoint.rollback()
    with statements(session.get_bind().engine) as seen:
        assert faults.described(link.id) == ("n0", "mlx5_1", 2, FaultKind.LINK_DOWN.value)
    assert len(seen) == 1  # that read's savepoint is gone: asked again
    faults.unresolved_at_their_ports()  # in the transaction itself again
    with statements(session.get_bind().engine) as seen:
        assert faults.described(other.id) == ("n1", "mlx5_0", 1, FaultKind.LINK_DOWN.value)
    assert seen == []


def test_faults_are_read_by_their_ids_in_one_statement(session: Session) -> None:
    made = [open_fault(session, f"n{i}", "mlx5_0", 1, FaultKind.LINK_DOWN) for i in range(3)]
    session.flush()
    faults = FaultRepo(session)
    with statements(session.get_bind().engine) as seen:
        assert faults.by_ids([made[2].id, made[0].id, made[2].id]) == [made[0], made[2]]
        assert faults.by_ids([]) == []
    assert len(seen) == 1


def test_the_evidence_gives_each_fault_its_own_ports_level(session: Session) -> None:
    """What the engine is told of each fault's port: down since when for a link's fault,
    for a degraded RNIC's and (port 1) for a whole RNIC's; up, with no time, for a GPU's,
    which names no port."""
    nodes = NodeRepo(session)
    nodes.replace_topology("n0", *rows(dual_port_node()), NOW)
    down_at = NOW + timedelta(seconds=5)
    for device, port in (("mlx5_1", 2), ("mlx5_2", 1), ("mlx5_3", 1)):
        assert nodes.observe_port("n0", device, port, "DOWN", down_at)
    open_fault(session, "n0", "mlx5_1", 2, FaultKind.LINK_DOWN)
    open_fault(session, "n0", "mlx5_2", 1, FaultKind.DEGRADED)
    open_fault(session, "n0", "mlx5_3", 0, FaultKind.RNIC_LOST)
    open_fault(session, "n0", "GPU-7", 0, FaultKind.GPU_LOST)
    nodes.replace_topology("n1", *rows(dual_port_node()), NOW)
    other = open_fault(session, "n1", "mlx5_0", 1, FaultKind.LINK_DOWN)
    session.flush()
    ev, rows_read = fabric.evidence(session, ["n0"])
    assert [(f.device, f.port, f.port_active, f.port_since) for f in ev.faults] == [
        ("mlx5_1", 2, False, down_at),
        ("mlx5_2", 1, False, down_at),
        ("mlx5_3", 0, False, down_at),
        ("GPU-7", 0, True, None),
    ]
    assert [f.id for f in rows_read] == [f.id for f in ev.faults]
    # More nodes than MANY_NODES: read fleet-wide, kept to those asked; None: every node.
    asked = ["n0", *(f"x{i}" for i in range(fabric.MANY_NODES))]
    assert fabric.evidence(session, asked)[1] == rows_read
    assert [f.id for f in fabric.evidence(session, None)[1]] == [
        *(f.id for f in rows_read),
        other.id,
    ]


def test_the_evidence_reads_flags_switch_failures_and_windows_as_their_rows_say(
    session: Session,
) -> None:
    """The evidence reads quarantines, switch failures and maintenance windows as values:
    each the same as built from its row, open ones only, windows not done, on the nodes
    asked or switch-wide (whether read for those nodes or fleet-wide and kept)."""
    later = NOW + timedelta(hours=1)
    flags = [
        m.MaintenanceFlag(node=n, device="mlx5_1", port=p, flagged_at=NOW, reason=f"flaps {n}")
        for n, p in (("n0", 2), ("n1", 1), ("n0", 1))
    ]
    flags[2].cleared_at = later
    switches = [
        m.SwitchFault(switch=sw, opened_at=NOW, nodes=["n0"], reason=f"{sw} lost")
        for sw in ("leaf-1", "leaf-2")
    ]
    switches[1].cleared_at = later

    def window(**on: Any) -> m.MaintenanceWindow:
        return m.MaintenanceWindow(
            start_at=later,
            end_at=later + timedelta(hours=2),
            moves_at=later - timedelta(minutes=5),
            reason=f"on {on}",
            created_at=NOW,
            **on,
        )

    windows = [
        window(node="n0", device="mlx5_3", port=1),
        window(switch="leaf-9"),
        window(node="n1"),
        window(node="n0", phase="done"),
        window(node="n0", cancelled_at=later),
    ]
    session.add_all([*flags, *switches, *windows])
    session.flush()

    def read(nodes: list[str] | None) -> tuple[Any, ...]:
        ev, _ = fabric.evidence(session, nodes)
        return ev.quarantines, ev.switches, ev.maintenance

    def built(on: set[str] | None) -> tuple[Any, ...]:
        return (
            tuple(
                health.Quarantine(f.id, f.node, f.device, f.port, f.flagged_at, f.reason)
                for f in flags[:2]
                if on is None or f.node in on
            ),
            (health.SwitchEvidence(switches[0].id, "leaf-1", NOW, "leaf-1 lost"),),
            tuple(
                fabric.window(w)
                for w in (windows[0], windows[1], windows[2], windows[4])
                if on is None or w.switch is not None or w.node in on
            ),
        )

    assert read(["n0"]) == built({"n0"})
    assert read(None) == built(None)
    many = ["n0", *(f"x{i}" for i in range(fabric.MANY_NODES))]  # read fleet-wide, then kept
    assert read(many) == built(set(many))
    assert len(read(["n0"])[2]) == 3  # its own link's window, the switch's, the cancelled


def test_evidence_on_more_than_many_nodes_is_read_fleet_wide(session: Session) -> None:
    """Up to MANY_NODES nodes, the open faults and the windows are read for those nodes;
    past it, fleet-wide (a query naming 8,192 nodes costs more than the few rows), and
    what they hold is the same either way (the previous test)."""
    engine = session.get_bind().engine

    def reads(count: int) -> list[str]:
        nodes = [f"n{i}" for i in range(count)]
        with statements(engine) as seen:
            fabric.evidence(session, nodes)
        return [s for s in seen if s.startswith("SELECT faults.") or "maintenance_windows" in s]

    few, many = reads(fabric.MANY_NODES), reads(fabric.MANY_NODES + 1)
    assert len(few) == len(many) == 2
    assert all(" IN (" in s for s in few)
    assert not any(" IN (" in s for s in many)


def test_a_reports_nodes_are_read_as_their_registered_ports(session: Session) -> None:
    repo = NodeRepo(session)
    repo.replace_topology("n0", *rows(dual_port_node()), NOW)
    repo.replace_topology("n1", *rows(hgx_node()), NOW)
    repo.replace_topology("bare", rows(hgx_node())[0], [], NOW)  # GPUs, no RNIC
    found = registered_ports(session, ["n0", "bare", "nowhere"])
    assert sorted(found) == ["bare", "n0"]  # n1 was not asked for; nowhere is not registered
    assert found["bare"].ports == {}
    assert found["n0"].ports["mlx5_0"] == frozenset({1, 2})
    assert len(found["n0"].ports) == len({r["name"] for r in dual_port_node()["rnics"]})


def job(job_id: str, nodes: list[str]) -> m.Job:
    j = m.Job(
        job_id=job_id,
        created_at=NOW,
        checkpoint_interval_s=3600,
        reload_s=600,
        detect_s=0,
        timeout_s=30,
        last_checkpoint_at=NOW,
    )
    j.ranks = [
        m.JobRank(rank=8 * i + g, node=n, gpu=g) for i, n in enumerate(nodes) for g in range(8)
    ]
    return j


def test_rank_queries(session: Session) -> None:
    jobs = JobRepo(session)
    jobs.add(job("j1", ["n0", "n1"]))
    jobs.add(job("j2", ["n1"]))
    assert jobs.rank_tuples("j1")[:2] == [(0, "n0", 0), (1, "n0", 1)]
    assert len(jobs.rank_tuples("j1")) == 16
    assert jobs.rank_counts() == {"j1": (16, ["n0", "n1"]), "j2": (8, ["n1"])}
    assert sorted(jobs.job_ids_on_node("n1")) == ["j1", "j2"]
    assert jobs.job_ids_on_node("n5") == []
    locked = jobs.lock("j2")
    assert locked is not None and locked.job_id == "j2"
    jobs.delete(locked)
    assert jobs.get("j2") is None
    assert jobs.rank_counts() == {"j1": (16, ["n0", "n1"])}


def test_a_placement_goes_in_whole_and_reads_back_in_rank_order(session: Session) -> None:
    """JobRepo.add's own path for the ranks (COPY on PostgreSQL, executemany on SQLite),
    in the session's transaction: a rolled-back savepoint takes them away again."""
    jobs = JobRepo(session)
    placed = [(r, f"rack-{r // 8:04d}.gpu", r % 8) for r in reversed(range(4096))]
    with session.begin_nested() as kept:
        jobs.add(job("j1", []), placed)
        assert jobs.rank_tuples("j1") == sorted(placed)
        assert jobs.rank_counts()["j1"][0] == 4096
        kept.rollback()
    assert jobs.rank_tuples("j1") == []
    jobs.add(job("j2", []), placed[:3])
    jobs.add(job("j3", []), [])  # no ranks: nothing to copy
    assert jobs.rank_tuples("j2") == sorted(placed[:3])
    assert jobs.rank_tuples("j3") == []


def test_progress_keeps_the_newest_count_and_its_rate(session: Session) -> None:
    JobRepo(session).add(job("j1", ["n0"]))
    repo = CoordinationRepo(session)

    def at(s: float, rank: int, ops: int) -> ProgressSample:
        return ProgressSample("j1", 7, rank, ops, NOW + timedelta(seconds=s))

    # First sight of rank 0, then a newer count in the same batch; rank 1 only once.
    repo.record_progress([at(0, 0, 100), at(2, 0, 300), at(0, 1, 50)])
    session.flush()
    repo.record_progress(
        [
            at(1, 0, 900),  # older than the stored sample: dropped
            at(3, 1, 40),  # fewer ops than stored (a restart of the count): dropped
            at(4, 1, 450),  # 400 ops in 4 s
        ]
    )
    session.flush()
    session.expire_all()
    got = {
        r.rank: (r.ops_done, r.at, r.rate_ops_per_s)
        for r in session.query(m.RankProgress).filter_by(job_id="j1")
    }
    assert got == {
        0: (300, NOW + timedelta(seconds=2), 100.0),
        1: (450, NOW + timedelta(seconds=4), 100.0),
    }
    repo.record_progress([])  # nothing to read or write


def test_commands_pending_superseded_and_unacknowledged(session: Session) -> None:
    JobRepo(session).add(job("j1", ["n0"]))
    repo = CommandRepo(session)
    cmds = [
        m.Command(node="n0", job_id="j1", kind="failover", created_at=NOW),
        m.Command(node="n0", job_id="j1", kind="rebalance", created_at=NOW + timedelta(1)),
        m.Command(node="n1", job_id="j1", kind="abort", created_at=NOW + timedelta(2)),
    ]
    repo.add_all(cmds)
    cmds[1].state = "delivered"
    session.flush()
    assert [c.kind for c in repo.pending_for_node("n0")] == ["failover", "rebalance"]
    assert [c.kind for c in repo.pending_for_node("n0", include_delivered=False)] == ["failover"]
    assert repo.has_pending("n1", include_delivered=False)
    assert not repo.has_pending("n9", include_delivered=True)
    assert repo.unacknowledged() == ({"issued": 2, "delivered": 1}, NOW)
    # Superseding: the job's waiting commands of the kinds asked for, each moved on.
    waiting = CommandRepo(session).job_commands(
        "j1", ["rebalance", "abort"], [s.value for s in WAITING]
    )
    assert [c.kind for c in waiting] == ["rebalance", "abort"]
    for c in waiting:
        assert transition(session, c, CommandState.SUPERSEDED, NOW)
    session.flush()
    session.expire_all()
    assert [c.state for c in repo.for_job("j1")] == ["issued", "superseded", "superseded"]
    repo.add_acks(
        [m.CommandAck(command_id=cmds[0].command_id, node="n0", status="applied", at=NOW)]
    )
    assert [a.status for a in repo.acks(cmds[0].command_id)] == ["applied"]
    assert repo.get(cmds[0].command_id) is cmds[0]


def test_a_command_is_got_as_held_or_read_by_its_key(session: Session) -> None:
    """`CommandRepo.get`: a command this session holds comes back as held, with no
    statement; one it does not hold is one read; an unknown id is None."""
    JobRepo(session).add(job("j1", ["n0"]))
    repo = CommandRepo(session)
    cmd = m.Command(node="n0", job_id="j1", kind="failover", created_at=NOW)
    repo.add_all([cmd])
    with statements(session.get_bind().engine) as seen:
        assert repo.get(cmd.command_id) is cmd
    assert seen == []
    command_id = cmd.command_id
    session.expunge_all()
    with statements(session.get_bind().engine) as seen:
        got = repo.get(command_id)
        assert got is not None and (got.node, got.kind) == ("n0", "failover")
        assert repo.get(command_id) is got  # held now
        assert repo.get(command_id + 1) is None
    assert len(seen) == 2
