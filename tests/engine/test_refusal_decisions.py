"""Optional mitigations the ranks refused, as outcomes of `reconcile`: fallen back from.

The service records a refusal in the job's desired state and trims what it commanded
(services/refusals.py); these stories do the same between passes, then check what
reconcile makes of it: who stays where, the exact record, what is sent, and when.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from scheduler_svc.engine.fabric import FaultEvidence, FaultKind
from scheduler_svc.engine.intents import IntentKind, command_diff, failback_refused, transit_refused
from scheduler_svc.engine.reconcile import recheck_at, reconcile, refusals
from scheduler_svc.engine.state import Action, Desired, HeldBack, Mode, Options
from tests.engine.stories import Story, at, kinds
from tests.engine.stories import down as down_on
from tests.engine.test_balance_nvl import T0, down, fabric, job, one_rail_comm

WHY = "failback command 9 failed on n0 (no QP for the primary)"


def failed_back() -> tuple[Story, Desired]:
    """Rank 3 failed over at 3000 s, its port back at 3100 and failed back at 3220; the
    desired state it ran on before the fail-back."""
    s = Story(["n0", "n1"])
    s.faults[1] = down_on(1, "n0", "mlx5_3", 3000)
    before = s.step(3000).desired
    assert before.moved == {3: "mlx5_2/1"} and before.mode == Mode.FAILED_OVER
    s.faults[1] = down_on(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    back = s.step(3220)
    assert back.decision is not None and back.decision.action == Action.FAILBACK
    assert kinds(s.intents[-1]) == [("failback", tuple(range(16)), ())]
    return s, before


def refuse(s: Story, when: float, ranks: tuple[int, ...] = (3,)) -> None:
    """What the service does with the failed ack: held in the desired state, and what the
    ranks still run in the commanded state."""
    s.desired = replace(s.desired, held=(HeldBack(77, ranks, at(when), WHY),))
    held = reconcile(at(when), s.job(), s.fabric(at(when)), s.options)
    s.commanded = failback_refused(s.commanded, held.desired, 77, ranks)


def test_a_refused_failback_keeps_its_ranks_on_backup_and_is_tried_again_after_damping() -> None:
    s, before = failed_back()
    refuse(s, 3225)
    # Rank 3 runs its backup and the balance plan it had: nothing is sent, nothing restarts.
    assert s.commanded.moved == {3: "mlx5_2/1"} and s.commanded.mode == Mode.FAILED_OVER
    out = s.step(3225)
    assert s.intents[-1] == []
    assert out.desired.same_outcome(before)
    assert out.desired.mitigation == before.mitigation == {77: "balance"}
    assert out.desired.held == (HeldBack(77, (3,), at(3225), WHY),)
    d = out.decision
    assert d is not None
    assert (d.action, d.trigger, d.fault_key) == (Action.FAILOVER, "refused:failback:77", None)
    assert d.reason == (
        f"fail-back refused ({WHY}): 1 rank(s) of communicator 77 stay on their backup; it "
        f"is tried again at {at(3345).isoformat()}"
    )
    assert d.plan["failed_over"] == [
        {"rank": 3, "node": "n0", "gpu": 3, "from": "mlx5_3/1", "to": "mlx5_2/1"}
    ]
    # The service comes back when the damping period (Options: 120 s) is over.
    assert recheck_at(out.desired, s.options) == at(3345)
    assert s.step(3344).decision is None and s.intents[-1] == []
    assert s.desired.held == (HeldBack(77, (3,), at(3225), WHY),)
    # Then the fail-back is tried again: one switch point for the communicator.
    again = s.step(3345)
    assert again.decision is not None and again.decision.action == Action.FAILBACK
    assert again.desired.mode == Mode.NORMAL and again.desired.moved == {}
    assert again.desired.held == () and recheck_at(again.desired, s.options) is None
    assert kinds(s.intents[-1]) == [("failback", tuple(range(16)), ())]
    assert [r.decision.action for r in s.decisions if r.decision is not None] == [
        Action.FAILOVER,
        Action.FAILBACK,
        Action.FAILOVER,
        Action.FAILBACK,
    ]


def test_a_failback_refused_again_is_held_again() -> None:
    s, _ = failed_back()
    refuse(s, 3225)
    s.step(3225)
    s.step(3345)
    refuse(s, 3350)
    out = s.step(3350)
    assert out.decision is not None and out.decision.trigger == "refused:failback:77"
    assert out.desired.moved == {3: "mlx5_2/1"} and s.intents[-1] == []
    assert recheck_at(out.desired, s.options) == at(3470)


def test_a_held_rank_whose_backup_fails_returns_to_its_primary() -> None:
    s, _ = failed_back()
    refuse(s, 3225)
    s.step(3225)
    # Its backup goes down while it is held: held there it would have no path at all.
    s.faults[2] = down_on(2, "n0", "mlx5_2", 3230)
    out = s.step(3230)
    assert 3 not in out.desired.moved
    assert out.desired.moved == {2: "mlx5_3/1"}  # rank 2, mlx5_2's own, moves the other way
    assert out.decision is not None and out.decision.action != Action.RESTART


def test_a_restart_forgets_the_refusals() -> None:
    s, _ = failed_back()
    refuse(s, 3225)
    s.desired = replace(s.desired, no_transit={78: "nvl_transit command 4 failed"})
    s.step(3225)
    assert refusals(at(3226), s.job(), s.options)[1] != ()
    # n1 loses both RNICs of GPU 0: rank 8 has no path left, the job restarts.
    s.faults[3] = down_on(3, "n1", "mlx5_0", 3230)
    s.faults[4] = down_on(4, "n1", "mlx5_1", 3230)
    out = s.step(3230)
    assert out.decision is not None and out.decision.action == Action.RESTART
    assert (out.desired.held, dict(out.desired.no_transit)) == ((), {})
    assert recheck_at(out.desired, s.options) is None
    assert refusals(at(3231), s.job(), s.options) == ({}, ())


def test_refusals_round_trip_and_are_stored_only_when_there_are_some() -> None:
    d = Desired(
        no_transit={78: "nvl_transit command 4 failed on n0 (unsupported)"},
        held=(HeldBack(77, (3, 11), T0, WHY), HeldBack(79, (1,), T0 + timedelta(seconds=1))),
    )
    doc = d.to_json()
    assert doc["no_transit"] == {"78": "nvl_transit command 4 failed on n0 (unsupported)"}
    assert doc["held"] == [
        {"comm_id": 77, "ranks": [3, 11], "since": T0.isoformat(), "why": WHY},
        {"comm_id": 79, "ranks": [1], "since": (T0 + timedelta(seconds=1)).isoformat(), "why": ""},
    ]
    assert Desired.from_json(doc) == d
    assert "no_transit" not in Desired().to_json() and "held" not in Desired().to_json()


def test_a_communicator_that_refused_nvl_transit_runs_s_bond_and_is_not_asked_again() -> None:
    # 4 rails, one-rail communicator 78 (ranks 2 and 10): mlx5_1 fails, NVL through GPU 0.
    now = T0 + timedelta(seconds=3000)
    comm = one_rail_comm(4)
    faults = [down("mlx5_1", 3000)]
    first = reconcile(now, job(comm, Desired()), fabric(4, faults, now), Options())
    assert first.desired.transit == {78: {2: 0}}
    told = first.desired
    # Rank 2's plugin (ABI 1) refuses the transit: recorded, and its GPU leaves what was told.
    why = "nvl_transit command 5 failed on n0 (unsupported: predate ABI 2)"
    previous = replace(first.desired, no_transit={78: why})
    commanded = transit_refused(told, 78, (2,))
    moved = {2: "mlx5_0/1", 3: "mlx5_0/1"}  # GPU 3 shares mlx5_1; rank 3 is not in 78
    assert commanded.transit == {} and commanded.moved == told.moved == moved
    later = now + timedelta(seconds=5)
    state = job(comm, previous, failed_over_at=now)
    out = reconcile(later, state, fabric(4, faults, later), Options())
    assert out.desired.mode == Mode.FAILED_OVER and out.desired.moved == moved
    assert out.desired.mitigation == {78: "s-bond"} and out.desired.transit == {}
    assert out.desired.no_transit == {78: why}
    d = out.decision
    assert d is not None
    assert (d.action, d.trigger, d.fault_key) == (Action.FAILOVER, "refused:nvl_transit:78", None)
    assert d.reason == (
        f"NVL transit refused by communicator 78's ranks ({why}): they run s-Bond only and are "
        "not asked again"
    )
    (record,) = d.plan["communicators"]
    nvl = next(o for o in record["options"] if o["mitigation"] == "nvl")
    assert (nvl["applicable"], nvl["why"]) == (False, f"refused by the ranks ({why}): s-Bond only")
    assert command_diff(commanded, out.desired, state) == []  # no restart, no transit asked
    # Pass after pass, and with a second fault on the node: never a transit again.
    state = job(comm, out.desired, failed_over_at=now)
    for s in (60, 600):
        at_s = now + timedelta(seconds=s)
        again = reconcile(at_s, state, fabric(4, faults, at_s), Options())
        assert again.decision is None and again.desired == out.desired
        assert command_diff(commanded, again.desired, state) == []
    # The same communicator's rank on n1 loses its primary too: it fails over, s-Bond only.
    worse = [*faults, FaultEvidence(2, "n1", "mlx5_1", 1, FaultKind.LINK_DOWN, now)]
    at_s = now + timedelta(seconds=700)
    second = reconcile(at_s, state, fabric(4, worse, at_s), Options())
    assert second.decision is not None and second.decision.action == Action.FAILOVER
    assert second.desired.moved[10] == "mlx5_0/1"
    assert second.desired.mitigation == {78: "s-bond"} and second.desired.transit == {}
    intents = command_diff(commanded, second.desired, state)
    assert [(i.kind, i.ranks) for i in intents] == [(IntentKind.FAILOVER, (10,))]
    assert second.desired.no_transit == {78: why}
