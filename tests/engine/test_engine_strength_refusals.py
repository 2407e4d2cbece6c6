"""Refused mitigations, told and forgotten: the stories the mutation run found untold.

Channel weights a communicator refused (`no_balance`) leave it the DCR plan, told once
and never asked again; a refusal only ever names a failover nothing else caused; a
restart forgets each kind of refusal alone; a refusal that arrives while the job
restarts does not bind its next incarnation; and the desired state keeps every field
through its JSON.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from scheduler_svc.engine.intents import IntentKind, failback_refused
from scheduler_svc.engine.reconcile import reconcile
from scheduler_svc.engine.state import (
    Action,
    CheckpointSeen,
    CommSpec,
    Desired,
    HeldBack,
    Mode,
    Options,
)
from tests.engine.stories import Story, at, down
from tests.engine.test_balance_nvl import T0, fabric, job, one_rail_comm
from tests.engine.test_balance_nvl import down as down_n0

WHY_77 = "balance command 5 failed on n0 (weights unsupported)"
WHY_78 = "balance command 6 failed on n1 (weights unsupported)"


def _dcr(c: int, why: str) -> str:
    return (
        f"channel weights refused by communicator {c}'s ranks ({why}): they run the DCR "
        "plan, its channels on failed rails off, and are not asked for weights again"
    )


def balanced(comms: tuple[CommSpec, ...] = (CommSpec(77, 16),)) -> Story:
    """n0/mlx5_3 fails at 3000 s: rank 3 (and 11's channels) fail over, balanced."""
    s = Story(["n0", "n1"], job_kw={"communicators": comms})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    first = s.step(3000)
    assert first.decision is not None and first.decision.action == Action.FAILOVER
    assert dict(s.desired.mitigation) == {c.comm_id: "balance" for c in comms}
    assert set(s.desired.weights) == {c.comm_id for c in comms}
    return s


def test_refused_channel_weights_leave_each_communicator_its_dcr_plan_told_once() -> None:
    s = balanced((CommSpec(77, 16), CommSpec(78, 16)))
    # What the service records from the failed acks (services/refusals.py, _balance).
    s.desired = replace(s.desired, no_balance={77: WHY_77, 78: WHY_78})
    out = s.step(3005)
    d = out.decision
    assert d is not None
    assert (d.action, d.trigger, d.fault_key) == (Action.FAILOVER, "refused:balance:77", None)
    assert d.reason == f"{_dcr(77, WHY_77)}; {_dcr(78, WHY_78)}"
    assert dict(out.desired.weights) == {} and dict(out.desired.split) == {}
    assert dict(out.desired.disabled) == {77: (3, 11), 78: (3, 11)}
    assert dict(out.desired.moved) == {3: "mlx5_2/1"}
    assert dict(out.desired.no_balance) == {77: WHY_77, 78: WHY_78}
    told = [(i.kind, i.comm_id, i.disabled_channels, i.weights) for i in s.intents[-1]]
    assert told == [
        (IntentKind.REBALANCE, 77, (3, 11), ()),
        (IntentKind.REBALANCE, 78, (3, 11), ()),
    ]
    # Pass after pass (Story.step checks each is level), the refusal stays and says nothing.
    for t in (3060, 3600):
        assert s.step(t).decision is None
        assert dict(s.desired.no_balance) == {77: WHY_77, 78: WHY_78}
        assert dict(s.desired.weights) == {}


def test_weights_refused_as_the_port_returns_leave_the_failback_told_as_such() -> None:
    s = balanced()
    s.desired = replace(s.desired, no_balance={77: WHY_77})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    out = s.step(3220)
    d = out.decision
    assert d is not None and d.action == Action.FAILBACK
    assert not d.trigger.startswith("refused:") and "weights refused" not in d.reason
    assert (out.desired.mode, dict(out.desired.moved)) == (Mode.NORMAL, {})
    assert dict(out.desired.no_balance) == {77: WHY_77}


def test_a_refused_failback_is_told_alone_beside_older_refusals() -> None:
    """Weights and NVL transit refused while failed over, then the fail-back refused: the
    hold is the failover's only cause, and its note says no more than that."""
    s = balanced()
    s.desired = replace(s.desired, no_balance={77: WHY_77}, no_transit={77: "nvl refused"})
    told = s.step(3005).decision
    assert told is not None and told.trigger == "refused:balance:77"
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    back = s.step(3220).decision
    assert back is not None and back.action == Action.FAILBACK
    # The fail-back is refused, with no detail in the failed ack.
    s.desired = replace(s.desired, held=(HeldBack(77, (3,), at(3225)),))
    held = reconcile(at(3225), s.job(), s.fabric(at(3225)), s.options)
    s.commanded = failback_refused(s.commanded, held.desired, 77, (3,))
    out = s.step(3225)
    d = out.decision
    assert d is not None
    assert (d.action, d.trigger, d.fault_key) == (Action.FAILOVER, "refused:failback:77", None)
    assert d.reason == (
        "fail-back refused (no detail): 1 rank(s) of communicator 77 stay on their backup; "
        f"it is tried again at {at(3345).isoformat()}"
    )
    assert dict(out.desired.weights) == {} and dict(out.desired.moved) == {3: "mlx5_2/1"}


@pytest.mark.parametrize(
    "refused",
    [
        {"no_transit": {77: "nvl_transit command 4 failed"}},
        {"no_balance": {77: WHY_77}},
    ],
    ids=["transit", "balance"],
)
def test_a_restart_forgets_each_kind_of_refusal_alone(refused: dict[str, object]) -> None:
    s = balanced()
    s.desired = replace(s.desired, **refused)  # type: ignore[arg-type]  # the two fields
    s.step(3005)
    assert s.desired.no_transit or s.desired.no_balance
    # n1 loses both RNICs of GPU 0: rank 8 has no path left, the job restarts.
    s.faults[3] = down(3, "n1", "mlx5_0", 3230)
    s.faults[4] = down(4, "n1", "mlx5_1", 3230)
    out = s.step(3230)
    assert out.decision is not None and out.decision.action == Action.RESTART
    assert out.desired.mode == Mode.RESTARTING
    assert (dict(out.desired.no_transit), dict(out.desired.no_balance)) == ({}, {})
    assert Desired.from_json(out.desired.to_json()) == out.desired


def test_weights_refused_after_the_restart_do_not_bind_the_next_incarnation() -> None:
    """A failed ack of the old incarnation's weights recorded while the job restarts: the
    new one, placed back on the open fault, is planned (and balanced) afresh."""
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 1000)
    assert s.step(1000).desired.mode == Mode.RESTARTING
    twin = Story(["n0", "n1"], desired=s.desired, mode=s.mode, faults=dict(s.faults))
    s.desired = replace(s.desired, no_balance={77: WHY_77})
    for story in (s, twin):
        story.restart_decided_at = None  # the next incarnation started
        story.checkpoint = CheckpointSeen(9, at(1100), received_at=at(1100))
    out, alike = s.step(1100), twin.step(1100)
    assert out.desired == alike.desired
    assert dict(out.desired.mitigation) == {77: "balance"} and len(out.desired.weights[77]) == 16
    assert dict(out.desired.no_balance) == {}


def test_transit_refused_after_the_restart_does_not_bind_the_next_incarnation() -> None:
    """As above for NVL transit: the one-rail communicator of the restarted job is sent
    over NVLink again, its old refusal forgotten."""
    comm = one_rail_comm(4)
    now = T0 + timedelta(seconds=3100)
    faults = [down_n0("mlx5_1", 3000)]
    restarting = Desired(
        mode=Mode.RESTARTING,
        evidence=frozenset({"fault:1"}),
        k=1.5,
        restarted_for=frozenset({"fault:1"}),
        no_transit={78: "nvl_transit command 5 failed on n0 (unsupported)"},
    )
    out = reconcile(now, job(comm, restarting), fabric(4, faults, now), Options())
    assert out.desired.mode == Mode.FAILED_OVER
    assert dict(out.desired.mitigation) == {78: "nvl"}
    assert {c: dict(t) for c, t in out.desired.transit.items()} == {78: {2: 0}}
    assert dict(out.desired.no_transit) == {}


def full_desired() -> Desired:
    """Every field of the desired state set, none to its default."""
    return Desired(
        mode=Mode.FAILED_OVER,
        moved={3: "mlx5_2/1", 11: "mlx5_2/1"},
        disabled={77: (3, 11)},
        weights={77: (0.25, 0.5, 0.25)},
        split={77: 0.125},
        transit={78: {2: 0, 10: 8}},
        evidence=frozenset({"fault:1", "switch:2"}),
        k=1.5,
        checkpoint_id=9,
        verdict="keep",
        mitigation={77: "balance", 78: "nvl"},
        checkpoint_after=1200,
        no_transit={79: "nvl_transit command 4 failed"},
        no_balance={80: WHY_77, 81: WHY_78},
        held=(HeldBack(77, (3, 11), T0, "failback command 9 failed"),),
        restarted_for=frozenset({"fault:0", "switch:1"}),
    )


def test_every_field_of_the_desired_state_survives_its_json() -> None:
    d = full_desired()
    doc = d.to_json()
    assert doc["no_balance"] == {"80": WHY_77, "81": WHY_78}
    assert doc["restarted_for"] == ["fault:0", "switch:1"]
    assert doc["no_transit"] == {"79": "nvl_transit command 4 failed"}
    assert doc["held"] == [
        {"comm_id": 77, "ranks": [3, 11], "since": T0.isoformat(), "why": d.held[0].why}
    ]
    back = Desired.from_json(doc)
    assert back == d
    for name in Desired.__dataclass_fields__:
        assert getattr(back, name) == getattr(d, name), name
        assert getattr(d, name) != getattr(Desired(), name), name  # every field is set


def test_a_held_fail_back_stored_without_a_why_reads_as_none_given() -> None:
    doc = full_desired().to_json()
    del doc["held"][0]["why"]
    (held,) = Desired.from_json(doc).held
    assert held == HeldBack(77, (3, 11), T0, "")


def test_weights_refused_as_a_new_fault_arrives_leave_the_fault_named() -> None:
    """The refusal and a new fault in one pass: the failover is the fault's."""
    s = balanced()
    s.desired = replace(s.desired, no_balance={77: WHY_77})
    s.faults[2] = down(2, "n1", "mlx5_5", 3004)
    out = s.step(3005)
    d = out.decision
    assert d is not None
    assert (d.action, d.trigger, d.fault_key) == (Action.FAILOVER, "fault:2", "fault:2")
    assert "weights refused" not in d.reason
    assert dict(out.desired.moved) == {3: "mlx5_2/1", 13: "mlx5_4/1"}
    assert dict(out.desired.weights) == {}


def test_a_transit_refusal_shows_on_the_nvl_option_alone() -> None:
    comm = one_rail_comm(4)
    now = T0 + timedelta(seconds=3000)
    faults = [down_n0("mlx5_1", 3000)]
    asked = reconcile(now, job(comm, Desired()), fabric(4, faults, now), Options())
    assert asked.desired.mitigation == {78: "nvl"} and asked.decision is not None
    why = "nvl_transit command 5 failed on n0 (unsupported)"
    refused = replace(asked.desired, no_transit={78: why})
    out = reconcile(now, job(comm, refused, failed_over_at=now), fabric(4, faults, now), Options())
    assert out.decision is not None
    (before,) = asked.decision.plan["communicators"]
    (after,) = out.decision.plan["communicators"]
    others = [o for o in before["options"] if o["mitigation"] != "nvl"]
    assert others and [o for o in after["options"] if o["mitigation"] != "nvl"] == others
    nvl = next(o for o in after["options"] if o["mitigation"] == "nvl")
    assert (nvl["applicable"], nvl["why"]) == (False, f"refused by the ranks ({why}): s-Bond only")
