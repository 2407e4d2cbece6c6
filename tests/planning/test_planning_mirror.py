"""mirror-plan: P_fail against a 50-digit reference, the recommendation and the placement."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from scheduler_svc.planning import mirror
from scheduler_svc.planning.mirror import p_fail, place, plan, switch_of
from scheduler_svc.planning.params import MirrorParams


def reference(p: str, n: int, k: int, m: int) -> mpmath.mpf:
    """The textbook formula, with enough working digits for 50 significant ones in the result."""
    digits = 50 + 10 + math.ceil(m * -math.log10(float(p)))
    with mpmath.workdps(digits):
        pm = mpmath.mpf(p)
        ok = (1 - pm ** (m - 1)) ** (mpmath.mpf(k * m) / n) * (1 - pm**m) ** (
            mpmath.mpf(k * (n - m)) / n
        )
        return +(1 - ok)


@pytest.mark.parametrize("p", ["1e-3", "1e-6", "1e-12", "1e-30", "1e-80"])
@pytest.mark.parametrize(("n", "k"), [(2, 1), (8, 1000), (64, 10**9)])
def test_p_fail_matches_the_high_precision_reference(p: str, n: int, k: int) -> None:
    ours = p_fail(float(p), n, k)
    for m in range(1, n + 1):
        ref = reference(p, n, k, m)
        if ref < mpmath.mpf("1e-300"):
            # Below double range: only ask that it underflows towards zero, not to junk.
            assert 0.0 <= ours[m - 1] < 1e-290
            continue
        assert float(ours[m - 1]) == pytest.approx(float(ref), rel=1e-12), (p, n, k, m)


def test_tiny_p_does_not_cancel_to_zero_where_the_textbook_form_does() -> None:
    p, n, k, m = 1e-9, 16, 100_000, 3
    textbook = 1 - (1 - p ** (m - 1)) ** (k * m / n) * (1 - p**m) ** (k * (n - m) / n)
    assert textbook == 0.0
    assert p_fail(p, n, k)[m - 1] == pytest.approx(float(reference("1e-9", n, k, m)), rel=1e-12)


def test_one_monitor_always_fails_and_zero_loss_never_fails_with_two() -> None:
    assert p_fail(1e-6, 8, 1000)[0] == 1.0
    probs = p_fail(0.0, 8, 1000)
    assert probs[0] == 1.0
    assert np.all(probs[1:] == 0.0)


def test_recommends_the_smallest_monitor_count_meeting_the_yearly_target() -> None:
    params = MirrorParams(loss=1e-6, dp=16, packets=100_000, target=1.0, iteration_s=6.0)
    result = plan(params)
    per_year = result.p_fail * params.iterations_per_year
    m = result.recommended
    assert m is not None
    assert per_year[m - 1] <= 1.0
    assert per_year[m - 2] > 1.0
    assert len(result.placement) == m


def test_no_recommendation_when_nothing_meets_the_target() -> None:
    result = plan(MirrorParams(loss=0.5, dp=4, packets=10**6, target=0.0))
    assert result.recommended is None
    assert result.placement == []


@pytest.mark.parametrize(("dp", "monitors", "rails", "per_switch"), [(16, 3, 8, 4), (64, 8, 8, 2)])
def test_placement_puts_every_monitor_behind_its_own_switch_and_rail(
    dp: int, monitors: int, rails: int, per_switch: int
) -> None:
    chosen = place(dp, monitors, rails, per_switch)
    switches = {switch_of(mon.rank, rails, per_switch) for mon in chosen}
    assert len(switches) == monitors
    assert len({mon.rail for mon in chosen}) == monitors
    assert not any(mon.shares_switch for mon in chosen)


def test_placement_flags_sharing_when_there_are_more_monitors_than_switches() -> None:
    # 8 ranks on 2 rails, 4 ranks of a rail per switch: only 2 switches.
    chosen = place(8, 3, rails=2, ranks_per_switch=4)
    assert len(chosen) == 3
    assert sum(mon.shares_switch for mon in chosen) == 2


def test_dp_ring_is_tensor_rank_0_of_pipeline_stage_0() -> None:
    assert mirror.dp_ring(4, 2, 2, 16) == [0, 2, 4, 6]
    assert mirror.dp_ring(8, 1, 1, 8) == list(range(8))
    with pytest.raises(ValueError, match="but the job has 12 ranks"):
        mirror.dp_ring(4, 2, 2, 12)


def test_placement_on_a_real_ring_keeps_monitors_off_shared_switches_while_it_can() -> None:
    # Ring positions 0-3 on one switch, 4-5 on a second, 6 on a third, 7 on an unknown one.
    switches = ["a", "a", "a", "a", "b", "b", "c", None]
    ring = tuple(
        mirror.RingRank(10 + i, f"n{i}", f"mlx5_{i}/1", i % 2, sw) for i, sw in enumerate(switches)
    )
    placed = mirror.place_on(ring, 4)
    assert [(m.rank, m.job_rank, m.switch, m.shares_switch) for m in placed] == [
        (0, 10, "a", False),
        (5, 15, "b", False),  # rank 4 is on the rail rank 0 already uses
        (6, 16, "c", False),
        (7, 17, "unknown", False),
    ]
