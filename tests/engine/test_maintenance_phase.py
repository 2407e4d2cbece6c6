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
