"""Fabric health at its boundaries: each clearing rule's exact answer and time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduler_svc.engine.fabric import (
    ClearingRules,
    Evidence,
    FabricHealth,
    FaultEvidence,
    FaultHealth,
    FaultKind,
    Health,
    Maintenance,
    MaintenancePhase,
    Quarantine,
    SwitchEvidence,
    Unhealthy,
    assess,
    fault_health,
    touching,
)
from scheduler_svc.engine.paths import FailedSet

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
RULES = ClearingRules(damping_s=2.5, quiet_s=90.0)


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def fault(kind: FaultKind, **kw: object) -> FaultEvidence:
    base: dict[str, object] = {
        "id": 7,
        "node": "n1",
        "device": "mlx5_0",
        "port": 1,
        "kind": kind,
        "opened_at": T0,
    }
    base.update(kw)
    return FaultEvidence(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", [FaultKind.LINK_DOWN, FaultKind.RNIC_FATAL])
def test_a_fault_whose_port_is_down_now_is_failed_whatever_up_came_before(
    kind: FaultKind,
) -> None:
    # Seen up at 10 s, then down again (the port's newest report): not recovering.
    again = fault(kind, recovered_at=s(10), port_active=False, port_since=s(11))
    assert fault_health(again, s(1000), RULES) == FaultHealth(again, Health.FAILED, "port is down")


def test_the_quiet_period_counts_from_the_ports_return() -> None:
    # A CQE error at 0 s, the port down and back ACTIVE at 50 s: quiet from 50 s, not 0 s.
    f = fault(FaultKind.RETRY_EXCEEDED, last_error_at=s(0), port_since=s(50))
    assert fault_health(f, s(100), RULES).health == Health.RECOVERING
    assert fault_health(f, s(139.9), RULES).clears_at == s(140)
    assert fault_health(f, s(140), RULES).health == Health.HEALTHY
    down = fault(FaultKind.RETRY_EXCEEDED, last_error_at=s(0), port_active=False, port_since=s(5))
    assert fault_health(down, s(1000), RULES) == FaultHealth(
        down, Health.FAILED, "port is not ACTIVE"
    )


@pytest.mark.parametrize("kind", [FaultKind.LINK_DOWN, FaultKind.RNIC_FATAL])
def test_port_up_damped(kind: FaultKind) -> None:
    down = fault(kind)
    assert fault_health(down, s(1000), RULES) == FaultHealth(down, Health.FAILED, "port is down")
    up = fault(kind, recovered_at=s(10))
    assert fault_health(up, s(12), RULES) == FaultHealth(
        up, Health.RECOVERING, "up again, damping 2.5 s", s(12.5)
    )
    # Exactly at the end of damping it has cleared.
    assert fault_health(up, s(12.5), RULES) == FaultHealth(
        up, Health.HEALTHY, "up and quiet for 2.5 s", s(12.5)
    )
    assert fault_health(up, s(13), RULES).health == Health.HEALTHY


@pytest.mark.parametrize(
    "kind", [FaultKind.RETRY_EXCEEDED, FaultKind.COUNTER_ERRORS, FaultKind.PCIE_DEGRADED]
)
def test_quiet(kind: FaultKind) -> None:
    inactive = fault(kind, port_active=False, last_error_at=s(5))
    assert fault_health(inactive, s(1000), RULES) == FaultHealth(
        inactive, Health.FAILED, "port is not ACTIVE"
    )
    never = fault(kind)
    assert fault_health(never, s(89), RULES) == FaultHealth(
        never, Health.RECOVERING, "port ACTIVE, quiet period 90 s", s(90)
    )
    assert fault_health(never, s(90), RULES) == FaultHealth(
        never, Health.HEALTHY, "port ACTIVE and no new error for 90 s", s(90)
    )
    # The newest error restarts the quiet period.
    later = fault(kind, last_error_at=s(30))
    assert fault_health(later, s(119), RULES) == FaultHealth(
        later, Health.RECOVERING, "port ACTIVE, quiet period 90 s", s(120)
    )
    assert fault_health(later, s(120), RULES).health == Health.HEALTHY
    # An error stamped before the fault opened does not shorten it.
    earlier = fault(kind, last_error_at=s(-60))
    assert fault_health(earlier, s(89), RULES).clears_at == s(90)


def test_registered_rule() -> None:
    for kind in (FaultKind.GPU_LOST, FaultKind.RNIC_LOST):
        f = fault(kind, recovered_at=s(1))
        assert fault_health(f, s(10**6), RULES) == FaultHealth(
            f, Health.FAILED, "missing from the node's registration"
        )


WAITING = "until its agent polls or acknowledges again"
HEARD = "its agent was heard from again"


@pytest.mark.parametrize(
    ("opened", "heard", "at", "health", "reason", "clears_at"),
    [
        # Never heard from since: failed however long it lasts (no damping to wait out).
        (0, None, 10**6, Health.FAILED, WAITING, None),
        # Heard from: healthy from that moment on, with no damping.
        (0, 5, 5, Health.HEALTHY, HEARD, 5),
        (0, 5, 10**6, Health.HEALTHY, HEARD, 5),
        (0, 0, 0, Health.HEALTHY, HEARD, 0),
        # Contact from before the fault opened says nothing about it.
        (10, 5, 10**6, Health.FAILED, WAITING, None),
    ],
)
def test_unreachable_clears_on_contact(  # noqa: PLR0917  # pytest passes one argument per column
    opened: float,
    heard: float | None,
    at: float,
    health: Health,
    reason: str,
    clears_at: float | None,
) -> None:
    u = fault(
        FaultKind.UNREACHABLE,
        device="*",
        port=0,
        opened_at=s(opened),
        recovered_at=None if heard is None else s(heard),
    )
    assert fault_health(u, s(at), RULES) == FaultHealth(
        u, health, reason, None if clears_at is None else s(clears_at)
    )
    h = assess(Evidence(faults=(u,)), s(at), RULES)
    assert h.cleared == (() if health == Health.FAILED else (h.healths[u.id],))
    assert h.failed.rnics == (frozenset({("n1", "*")}) if health == Health.FAILED else frozenset())
    assert h.next_change_at is None  # nothing clears it but the agent


def test_fractional_rules_format_with_g() -> None:
    rules = ClearingRules(damping_s=1e-3, quiet_s=1234567.0)
    up = fault(FaultKind.LINK_DOWN, recovered_at=T0)
    assert fault_health(up, T0, rules).reason == "up again, damping 0.001 s"
    q = fault(FaultKind.COUNTER_ERRORS)
    assert fault_health(q, T0, rules).reason == "port ACTIVE, quiet period 1.23457e+06 s"


def window(**kw: object) -> Maintenance:
    base: dict[str, object] = {
        "id": 3,
        "starts_at": s(100),
        "ends_at": s(200),
        "node": "n1",
        "moves_at": s(40),
    }
    base.update(kw)
    return Maintenance(**base)  # type: ignore[arg-type]


def test_phase_and_active_at_every_mark() -> None:
    w = window()
    cases = [
        (39, MaintenancePhase.SCHEDULED, False),
        (40, MaintenancePhase.MOVING, True),
        (99, MaintenancePhase.MOVING, True),
        (100, MaintenancePhase.ACTIVE, True),
        (199, MaintenancePhase.ACTIVE, True),
        (200, MaintenancePhase.ENDED, True),
        (209, MaintenancePhase.ENDED, True),
        (210, MaintenancePhase.DONE, False),
    ]
    for at, phase, active in cases:
        assert w.phase(s(at), 10.0) == phase, at
        assert w.active(s(at), 10.0) is active, at
    # Without damping it is done the moment it ends; the damping defaults to none.
    assert w.phase(s(200)) == MaintenancePhase.DONE
    assert w.active(s(200)) is False
    assert w.active(s(199)) is True
    assert w.active(s(39)) is False


def test_phase_of_a_window_cancelled_before_anything_moved() -> None:
    w = window(cancelled_at=s(30))
    assert w.phase(s(29), 10.0) == MaintenancePhase.SCHEDULED
    assert w.phase(s(30), 10.0) == MaintenancePhase.DONE
    assert w.active(s(29), 10.0) is False
    assert w.next_change(s(0), 10.0) == s(30)
    assert w.next_change(s(30), 10.0) is None
    # Cancelled exactly when the moving starts: nothing moved either.
    at_moves = window(cancelled_at=s(40))
    assert at_moves.phase(s(40), 10.0) == MaintenancePhase.DONE


def test_phase_of_a_window_cancelled_while_moving_has_no_damping() -> None:
    w = window(cancelled_at=s(60))
    assert w.phase(s(59), 10.0) == MaintenancePhase.MOVING
    assert w.phase(s(60), 10.0) == MaintenancePhase.DONE
    assert w.next_change(s(50), 10.0) == s(60)
    assert w.next_change(s(60), 10.0) is None


def test_next_change_walks_the_marks() -> None:
    w = window()
    assert w.next_change(s(0), 10.0) == s(40)
    assert w.next_change(s(40), 10.0) == s(100)
    assert w.next_change(s(100), 10.0) == s(200)
    assert w.next_change(s(200), 10.0) == s(210)
    assert w.next_change(s(210), 10.0) is None
    assert w.next_change(s(150)) == s(200)
    assert w.next_change(s(200)) is None


def test_moves_at_after_the_start_counts_from_the_start() -> None:
    w = window(moves_at=s(150))
    assert w.phase(s(99), 0.0) == MaintenancePhase.SCHEDULED
    assert w.phase(s(100), 0.0) == MaintenancePhase.ACTIVE
    assert window(moves_at=None).phase(s(100)) == MaintenancePhase.ACTIVE
    assert window(moves_at=None).phase(s(99)) == MaintenancePhase.SCHEDULED


def u(key: str, node: str | None) -> Unhealthy:
    return Unhealthy(key, key, "link_down", T0, "r", node=node)


def test_touching_keeps_the_nodes_and_every_switch_wide_piece_in_order() -> None:
    pieces = [u("a", "n1"), u("b", None), u("c", "n2"), u("d", "n3"), u("e", "n1")]
    assert [x.key for x in touching(pieces, {"n1", "n3"})] == ["a", "b", "d", "e"]
    assert [x.key for x in touching(pieces, set())] == ["b"]
    assert touching(iter(pieces), {"n2"}) == [pieces[1], pieces[2]]


def test_a_window_cancelled_exactly_at_its_start_clears_without_damping() -> None:
    """The target was never worked on: the window never opened."""
    w = window(cancelled_at=s(100))
    assert w.phase(s(99), 10.0) == MaintenancePhase.MOVING
    assert w.phase(s(100), 10.0) == MaintenancePhase.DONE
    assert w.next_change(s(50), 10.0) == s(100)
    assert w.next_change(s(100), 10.0) is None
    # One second into the window, the damping applies.
    opened = window(cancelled_at=s(101))
    assert opened.phase(s(101), 10.0) == MaintenancePhase.ENDED
    assert opened.phase(s(111), 10.0) == MaintenancePhase.DONE


def test_assess_puts_each_piece_of_evidence_where_it_belongs() -> None:
    faults = (
        fault(FaultKind.LINK_DOWN, id=1, opened_at=s(5), recovered_at=s(10)),  # recovering
        fault(FaultKind.LINK_DOWN, id=2, recovered_at=s(1)),  # cleared at 3.5
        fault(FaultKind.GPU_LOST, id=3, port=2, opened_at=s(3)),
        fault(FaultKind.UNREACHABLE, id=4, node="n2", opened_at=s(4), note="no acks"),
        fault(FaultKind.UNREACHABLE, id=5, node="n3", opened_at=s(4)),
        fault(FaultKind.RNIC_FATAL, id=6, device="mlx5_1", port=0, opened_at=s(2)),
        fault(FaultKind.COUNTER_ERRORS, id=7, device="mlx5_2", port=1, opened_at=s(6)),
    )
    evidence = Evidence(
        faults=faults,
        switches=(SwitchEvidence(8, "s9", s(1), "all links down"),),
        quarantines=(Quarantine(9, "n4", "mlx5_0", 2, s(7), "flapped"),),
        maintenance=(
            Maintenance(10, s(0), s(100), switch="s7", reason="fw"),
            Maintenance(11, s(0), s(100), node="n5", moves_at=s(-5)),
            Maintenance(12, s(0), s(100), node="n6", device="mlx5_3", reason="card"),
            Maintenance(13, s(0), s(100), node="n7", device="mlx5_4", port=2),
            Maintenance(14, s(50), s(100), node="n8"),  # not yet
            Maintenance(15, s(0), s(11), node="n9", device="mlx5_5"),  # ended, damping
        ),
    )
    h = assess(evidence, s(12), RULES)
    assert h.failed == FailedSet(
        rnics=frozenset(
            {
                ("n2", "*"),
                ("n3", "*"),
                ("n1", "mlx5_1"),
                ("n5", "*"),
                ("n6", "mlx5_3"),
                ("n9", "mlx5_5"),
            }
        ),
        links=frozenset(
            {("n1", "mlx5_0", 1), ("n1", "mlx5_2", 1), ("n4", "mlx5_0", 2), ("n7", "mlx5_4", 2)}
        ),
        switches=frozenset({"s9", "s7"}),
        gpus=frozenset({("n1", 2)}),
    )
    assert h.cleared == (h.healths[2],)
    assert h.healths[2].health == Health.HEALTHY
    assert sorted(h.healths) == [1, 2, 3, 4, 5, 6, 7]
    # Fault 1 clears at 12.5; the earliest change of anything.
    assert h.next_change_at == s(12.5)
    window = f"{s(0).isoformat(timespec='seconds')} to {s(100).isoformat(timespec='seconds')}"
    assert [(u.key, u.label, u.kind, u.since, u.reason) for u in h.unhealthy] == [
        ("maintenance:11", "n5", "maintenance", s(-5), f"planned maintenance 11 () from {window}"),
        ("maintenance:10", "s7", "maintenance", s(0), f"planned maintenance 10 (fw) from {window}"),
        (
            "maintenance:12",
            "n6/mlx5_3",
            "maintenance",
            s(0),
            f"planned maintenance 12 (card) from {window}",
        ),
        (
            "maintenance:13",
            "n7/mlx5_4/2",
            "maintenance",
            s(0),
            f"planned maintenance 13 () from {window}",
        ),
        (
            "maintenance:15",
            "n9/mlx5_5",
            "maintenance",
            s(0),
            "planned maintenance 15 () over, damping 2.5 s",
        ),
        ("switch:8", "s9", "switch", s(1), "all links down"),
        ("fault:6", "n1/mlx5_1", "rnic_fatal", s(2), "port is down"),
        ("fault:3", "n1/gpu2", "gpu_lost", s(3), "missing from the node's registration"),
        ("fault:4", "n2", "unreachable", s(4), "no acks"),
        ("fault:5", "n3", "unreachable", s(4), WAITING),
        ("fault:1", "n1/mlx5_0/1", "link_down", s(5), "up again, damping 2.5 s"),
        ("fault:7", "n1/mlx5_2/1", "counter_errors", s(6), "port ACTIVE, quiet period 90 s"),
        ("flag:9", "n4/mlx5_0/2", "quarantine", s(7), "flapped"),
    ]
    where = {u.key: (u.node, u.device, u.port, u.switch) for u in h.unhealthy}
    assert where["fault:3"] == ("n1", "mlx5_0", 2, None)
    assert where["switch:8"] == (None, None, None, "s9")
    assert where["flag:9"] == ("n4", "mlx5_0", 2, None)
    assert where["maintenance:13"] == ("n7", "mlx5_4", 2, None)
    assert where["maintenance:10"] == (None, None, 0, "s7")
    assert where["maintenance:11"] == ("n5", None, 0, None)
    assert where["fault:7"] == ("n1", "mlx5_2", 1, None)


def test_assess_next_change_is_the_earliest_of_faults_and_windows() -> None:
    early_window = Evidence(
        faults=(fault(FaultKind.LINK_DOWN, recovered_at=s(10)),),  # clears at 12.5
        maintenance=(Maintenance(1, s(12), s(20), node="n5"),),
    )
    assert assess(early_window, s(11), RULES).next_change_at == s(12)
    late_window = Evidence(
        faults=(fault(FaultKind.LINK_DOWN, recovered_at=s(10)),),
        maintenance=(Maintenance(1, s(13), s(20), node="n5"),),
    )
    assert assess(late_window, s(11), RULES).next_change_at == s(12.5)
    two_faults = Evidence(
        faults=(
            fault(FaultKind.LINK_DOWN, id=1, recovered_at=s(10)),
            fault(FaultKind.LINK_DOWN, id=2, recovered_at=s(9)),
            fault(FaultKind.LINK_DOWN, id=3, recovered_at=s(11)),
        )
    )
    assert assess(two_faults, s(11), RULES).next_change_at == s(11.5)
    assert assess(Evidence(), s(11), RULES) == FabricHealth(FailedSet(), (), (), None, {})


def test_a_window_naming_a_device_but_no_node_takes_nothing_out() -> None:
    w = Maintenance(1, s(0), s(100), device="mlx5_0")
    h = assess(Evidence(maintenance=(w,)), s(50), RULES)
    assert h.failed == FailedSet()
    assert [u.key for u in h.unhealthy] == ["maintenance:1"]
