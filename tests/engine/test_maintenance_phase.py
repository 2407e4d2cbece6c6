"""A maintenance window's phase is a function of its times, the clock and the damping period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduler_svc.engine.fabric import (
    ClearingRules,
    Evidence,
    Maintenance,
    MaintenancePhase,
    assess,
)

T0 = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)
DAMPING = 60.0


def window(cancel_s: float | None = None) -> Maintenance:
    """Starts at T0, lasts an hour, jobs move 120 s ahead."""
    return Maintenance(
        id=7,
        starts_at=T0,
        ends_at=T0 + timedelta(hours=1),
        switch="rail3-a",
        moves_at=T0 - timedelta(seconds=120),
        cancelled_at=None if cancel_s is None else T0 + timedelta(seconds=cancel_s),
        reason="firmware",
    )


@pytest.mark.parametrize(
    ("cancel_s", "now_s", "phase", "next_s"),
    [
        (None, -121, MaintenancePhase.SCHEDULED, -120),
        (None, -120, MaintenancePhase.MOVING, 0),
        (None, 0, MaintenancePhase.ACTIVE, 3600),
        (None, 3600, MaintenancePhase.ENDED, 3660),
        (None, 3660, MaintenancePhase.DONE, None),
        # Cancelled while open: damped from the cancellation.
        (600, 600, MaintenancePhase.ENDED, 660),
        (600, 660, MaintenancePhase.DONE, None),
        # Cancelled in the lead time: nothing was worked on, so no damping.
        (-60, -60, MaintenancePhase.DONE, None),
        # Cancelled before anything moved.
        (-3600, -3600, MaintenancePhase.DONE, None),
    ],
)
def test_phase_and_next_change(
    cancel_s: float | None, now_s: float, phase: MaintenancePhase, next_s: float | None
) -> None:
    w = window(cancel_s)
    now = T0 + timedelta(seconds=now_s)
    assert w.phase(now, DAMPING) == phase
    expected = None if next_s is None else T0 + timedelta(seconds=next_s)
    assert w.next_change(now, DAMPING) == expected


@pytest.mark.parametrize(
    ("now_s", "out"), [(-121, False), (-120, True), (1800, True), (3659, True), (3660, False)]
)
def test_the_switch_is_out_of_service_from_the_lead_time_until_damped(
    now_s: float, out: bool
) -> None:
    health = assess(
        Evidence(maintenance=(window(),)),
        T0 + timedelta(seconds=now_s),
        ClearingRules(damping_s=DAMPING, quiet_s=300),
    )
    assert ("rail3-a" in health.failed.switches) is out
    assert [u.key for u in health.unhealthy] == (["maintenance:7"] if out else [])
    assert health.next_change_at is not None or now_s >= 3660


def _on(**target: object) -> Maintenance:
    base = window()
    return Maintenance(
        id=int(str(target.pop("id", 8))),
        starts_at=base.starts_at,
        ends_at=base.ends_at,
        moves_at=base.moves_at,
        reason="swap optics",
        **target,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("target", "rnics", "links", "switches", "label"),
    [
        ({"switch": "rail3-a"}, set(), set(), {"rail3-a"}, "rail3-a"),
        ({"node": "n7"}, {("n7", "*")}, set(), set(), "n7"),
        ({"node": "n7", "device": "mlx5_2"}, {("n7", "mlx5_2")}, set(), set(), "n7/mlx5_2"),
        (
            {"node": "n7", "device": "mlx5_2", "port": 2},
            set(),
            {("n7", "mlx5_2", 2)},
            set(),
            "n7/mlx5_2/2",
        ),
    ],
)
def test_each_target_takes_out_exactly_its_component(
    target: dict[str, object],
    rnics: set[tuple[str, str]],
    links: set[tuple[str, str, int]],
    switches: set[str],
    label: str,
) -> None:
    health = assess(Evidence(maintenance=(_on(**target),)), T0, ClearingRules(DAMPING, 300))
    assert set(health.failed.rnics) == rnics
    assert set(health.failed.links) == links
    assert set(health.failed.switches) == switches
    assert not health.failed.gpus
    (u,) = health.unhealthy
    assert (u.key, u.label, u.kind, u.since) == (
        "maintenance:8",
        label,
        "maintenance",
        T0 - timedelta(seconds=120),
    )
    assert (u.node, u.device, u.switch) == (
        target.get("node"),
        target.get("device"),
        target.get("switch"),
    )
    assert u.reason == (
        "planned maintenance 8 (swap optics) from 2026-11-01T02:00:00+00:00 to "
        "2026-11-01T03:00:00+00:00"
    )


def test_the_earliest_change_of_several_windows_and_the_damping_reason() -> None:
    now = T0 + timedelta(hours=1, seconds=10)  # window 7 is over and damping
    later = Maintenance(
        id=9,
        starts_at=T0 + timedelta(hours=2),
        ends_at=T0 + timedelta(hours=3),
        node="n1",
        moves_at=T0 + timedelta(hours=2) - timedelta(seconds=120),
    )
    for windows in ((window(), later), (later, window())):
        health = assess(Evidence(maintenance=windows), now, ClearingRules(DAMPING, 300))
        # Window 7 clears 60 s after its end, before window 9's jobs start to move.
        assert health.next_change_at == T0 + timedelta(hours=1, seconds=60)
        (u,) = health.unhealthy
        assert u.key == "maintenance:7"
        assert u.reason == "planned maintenance 7 (firmware) over, damping 60 s"
        assert set(health.failed.switches) == {"rail3-a"}
        assert not health.failed.rnics
    # Past window 7's damping, window 9's move is the next change; nothing is out.
    quiet = assess(
        Evidence(maintenance=(window(), later)),
        T0 + timedelta(hours=1, minutes=5),
        ClearingRules(DAMPING, 300),
    )
    assert quiet.next_change_at == later.moves_at
    assert quiet.unhealthy == ()
