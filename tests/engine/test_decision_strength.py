"""The decision at its edges: the exact tie, every option's cost and the reason's text."""

from __future__ import annotations

import pytest

from scheduler_svc.engine.decision import (
    IB_TIMEOUT_UNIT_S,
    Action,
    decide,
    failover_cost_s,
    failover_threshold_s,
    ib_timeout_s,
    restart_cost_s,
    restart_scaled_cost_s,
    saved_gpu_s,
    total_saved_gpu_s,
)
from scheduler_svc.engine.slowdown import (
    KSource,
    SlowdownEstimate,
    default_k,
    estimate_k,
    modelled_k,
)
from tests.engine.test_decision import inputs


def test_exact_tie_restarts() -> None:
    """Eq. (3): fail over when t_failover < t_restart; at equality the answer is restart.

    With these numbers every term is exact in binary floating point, so the two
    costs are equal, not merely close: 30 + 1.5·(3600 − 1200) + 600 = 30 + 600 + 3600.
    """
    d = decide(inputs(elapsed_s=1200.0))
    assert d.costs_s["failover"] == d.costs_s["restart"] == 4230.0
    assert d.threshold_s == 1200.0
    assert d.action == Action.RESTART
    assert d.reason == (
        "restart: only 20.0 min since the last checkpoint, before the 20.0 min threshold "
        "at k=1.5: restart costs 1.18 h, failing over 1.18 h"
    )


def test_one_second_past_the_tie_fails_over() -> None:
    d = decide(inputs(elapsed_s=1201.0))
    assert d.action == Action.FAILOVER
    assert d.costs_s["failover"] == 4228.5
    assert d.reason == (
        "fail over: 20.0 min since the last checkpoint is past the 20.0 min threshold at "
        "k=1.5: failing over costs 1.17 h, restart 1.18 h"
    )


def test_tie_with_scaled_restart_goes_to_plain_restart() -> None:
    # dp=2: scaled restart = 30 + 600 + 3600·2 = 7830 > restart 4230: restart is cheaper.
    d = decide(inputs(elapsed_s=1200.0, allow_scaling=True, dp_size=2, new_dp_size=1))
    assert d.costs_s["restart_scaled"] == 7830.0
    assert d.action == Action.RESTART


def test_scaled_restart_tie_keeps_plain_restart() -> None:
    """Equal restart and scaled-restart costs: the plain restart keeps every replica."""
    # restart waits 1800 s for a node: 30 + 0 + 600 + 1800 + 3600 = 6030;
    # scaled with dp=2: 30 + 0 + 600 + 7200 = 7830. Make them equal with dp and wait:
    # wait w: 4230 + w = 630 + 3600·dp/(dp−1); dp=4: 630 + 4800 = 5430 → w = 1200.
    d = decide(
        inputs(
            elapsed_s=0.0,
            path_available=False,
            allow_scaling=True,
            dp_size=4,
            new_dp_size=3,
            spare_nodes=False,
            node_replace_s=1200.0,
        )
    )
    assert d.costs_s["restart"] == d.costs_s["restart_scaled"] == 5430.0
    assert d.action == Action.RESTART
    assert d.reason == (
        "no usable path is left for some GPU (primary and backup both lost); "
        "restart (1.51 h) is the only way forward"
    )


def test_scaled_restart_chosen_when_cheaper_and_its_gpu_cost_counts_fewer_gpus() -> None:
    d = decide(
        inputs(
            elapsed_s=0.0,
            allow_scaling=True,
            dp_size=4,
            new_dp_size=3,
            spare_nodes=False,
            node_replace_s=1201.0,
        )
    )
    assert d.costs_s["restart"] == 5431.0
    assert d.costs_s["restart_scaled"] == 5430.0
    assert d.action == Action.RESTART_SCALED
    assert d.costs_gpu_s["restart_scaled"] == 5430.0 * 16 * 3 / 4
    assert d.costs_gpu_s["restart"] == 5431.0 * 16
    assert d.costs_gpu_s["failover"] == d.costs_s["failover"] * 16  # type: ignore[operator]
    assert d.costs_gpu_s["none"] is None
    assert d.reason.startswith("restart_scaled: only 0 s since the last checkpoint")


def test_spare_nodes_mean_no_replacement_wait() -> None:
    d = decide(inputs(node_replace_s=5000.0))
    assert d.costs_s["restart"] == 4230.0
    d = decide(inputs(node_replace_s=5000.0, spare_nodes=False))
    assert d.costs_s["restart"] == 9230.0


def test_scaling_needs_a_replica_left() -> None:
    assert decide(inputs(allow_scaling=True, dp_size=1)).costs_s["restart_scaled"] is None
    # No new DP size (the layout leaves nothing to run): no scaled option at any dp.
    assert decide(inputs(allow_scaling=True, dp_size=8)).costs_s["restart_scaled"] is None
    scaled = decide(inputs(allow_scaling=True, dp_size=2, new_dp_size=1))
    assert scaled.costs_s["restart_scaled"] == 7830.0
    with pytest.raises(
        ValueError, match=r"^restart_scaled needs 1 <= new_dp_size < dp_size, got 1 of 1$"
    ):
        restart_scaled_cost_s(3600.0, 0.0, 600.0, 30.0, 1, new_dp_size=1)
    with pytest.raises(ValueError, match=r"^restart_scaled needs 1 <= new_dp_size < dp_size"):
        restart_scaled_cost_s(3600.0, 0.0, 600.0, 30.0, 4, new_dp_size=0)
    assert restart_scaled_cost_s(3600.0, 10.0, 600.0, 30.0, 2, new_dp_size=1) == (
        30 + 10 + 600 + 7200
    )


def test_scaled_cost_follows_the_real_new_dp_size_not_dp_minus_one() -> None:
    # dp 8 losing 2 replicas (a node holding ranks of two): 3600 · 8/6 = 4800 s of work.
    d = decide(inputs(allow_scaling=True, dp_size=8, new_dp_size=6))
    assert d.costs_s["restart_scaled"] == 30 + 600 + 4800.0
    assert d.costs_gpu_s["restart_scaled"] == (30 + 600 + 4800.0) * 16 * 6 / 8
    # The same job losing one replica: 3600 · 8/7.
    one = decide(inputs(allow_scaling=True, dp_size=8, new_dp_size=7))
    assert one.costs_s["restart_scaled"] == 30 + 600 + 3600 * 8 / 7
    with pytest.raises(ValueError, match=r"^new_dp_size must be 1..dp_size-1 \(7\), got 8$"):
        inputs(allow_scaling=True, dp_size=8, new_dp_size=8)


def test_gpu_share_without_scaling_is_whole() -> None:
    d = decide(inputs(dp_size=1, elapsed_s=3000.0))
    assert d.costs_gpu_s["restart"] == 4230.0 * 16
    assert d.costs_gpu_s["restart_scaled"] is None


def test_equations_term_by_term() -> None:
    assert restart_cost_s(3600.0, 7.0, 600.0, 30.0) == 4237.0
    assert failover_cost_s(3600.0, 600.0, 600.0, 30.0, 2.0) == 30 + 2 * 3000 + 600
    assert failover_threshold_s(3600.0, 60.0, 2.0) == (3600 - 60) / 2
    assert ib_timeout_s(0, 0) == IB_TIMEOUT_UNIT_S == 4.096e-6
    assert ib_timeout_s(31, 7) == 4.096e-6 * 2**31 * 8
    assert ib_timeout_s(3, 2) == 4.096e-6 * 8 * 3


@pytest.mark.parametrize(
    ("exp", "retry", "message"),
    [
        (32, 0, "^timeout_exponent must be 0..31 \\(IB 5-bit field\\), got 32$"),
        (-1, 0, "^timeout_exponent must be 0..31 \\(IB 5-bit field\\), got -1$"),
        (0, 8, "^retry_cnt must be 0..7 \\(IB 3-bit field\\), got 8$"),
        (0, -1, "^retry_cnt must be 0..7 \\(IB 3-bit field\\), got -1$"),
    ],
)
def test_ib_timeout_bounds(exp: int, retry: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ib_timeout_s(exp, retry)


def test_elapsed_capped_at_interval_with_a_note() -> None:
    d = decide(inputs(elapsed_s=3600.0))
    assert d.notes == ()
    d = decide(inputs(elapsed_s=7200.0))
    assert d.costs_s["failover"] == 630.0
    assert d.notes == (
        "t_elapsed 2.00 h exceeds the checkpoint interval; "
        "capped at the interval (a checkpoint is overdue)",
    )


def test_none_costs_the_rest_of_the_interval() -> None:
    healed = decide(inputs(elapsed_s=100.0, healed=True))
    assert healed.action == Action.NONE
    assert healed.costs_s["none"] == 3500.0
    assert healed.costs_gpu_s["none"] == 3500.0 * 16
    assert healed.reason == "the fault healed before the job needed to move; nothing to do"
    backup = decide(inputs(elapsed_s=100.0, affected=False, path_available=False))
    assert backup.action == Action.NONE
    assert backup.reason == (
        "no rank of this job uses the failed port as its primary; only backup redundancy is reduced"
    )
    assert decide(inputs(elapsed_s=100.0)).costs_s["none"] is None


def test_inputs_are_kept_and_threshold_reported_even_when_negative() -> None:
    inp = inputs(detect_s=3000.0, elapsed_s=0.0)
    d = decide(inp)
    assert d.inputs is inp
    assert d.threshold_s == (3600 * 0.5 - 3000) / 1.5
    assert d.action == Action.FAILOVER
    # The reason never shows a negative threshold.
    assert "past the 0 s threshold" in d.reason


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(59.4, "59 s"), (60.0, "1.0 min"), (3599.0, "60.0 min"), (3600.0, "1.00 h")],
)
def test_durations_in_reasons(seconds: float, text: str) -> None:
    # interval 2 h, k 1.5 → threshold (7200·0.5)/1.5 = 2400 s = 40.0 min
    d = decide(inputs(elapsed_s=seconds, checkpoint_interval_s=7200.0))
    assert f" {text} since the last checkpoint" in d.reason
    assert " the 40.0 min threshold" in d.reason


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("checkpoint_interval_s", 0.0, "^checkpoint_interval_s must be > 0, got 0.0$"),
        ("gpus", 0, "^gpus must be > 0, got 0$"),
        ("elapsed_s", -1.0, "^elapsed_s must be a finite number >= 0, got -1.0$"),
        ("detect_s", -0.5, "^detect_s must be a finite number >= 0, got -0.5$"),
        ("reload_s", float("inf"), "^reload_s must be a finite number >= 0, got inf$"),
        ("timeout_s", float("nan"), "^timeout_s must be a finite number >= 0, got nan$"),
        ("node_replace_s", -1.0, "^node_replace_s must be a finite number >= 0, got -1.0$"),
        ("k", 0.99, "^k \\(slowdown while failed over\\) must be >= 1, got 0.99$"),
        ("k", float("inf"), "^k \\(slowdown while failed over\\) must be >= 1, got inf$"),
        ("dp_size", 0, "^dp_size must be >= 1, got 0$"),
    ],
)
def test_each_bad_input_is_named(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        inputs(**{field: value})


def test_boundary_inputs_are_accepted() -> None:
    d = decide(
        inputs(k=1.0, elapsed_s=0.0, detect_s=0.0, reload_s=0.0, timeout_s=0.0, dp_size=1, gpus=1)
    )
    assert d.threshold_s == 0.0
    # k = 1: failing over costs exactly the lost interval, restarting the same: a tie, restart.
    assert d.costs_s["failover"] == d.costs_s["restart"] == 3600.0
    assert d.action == Action.RESTART


def test_scaled_restart_of_two_replicas_costs_half_the_gpus() -> None:
    d = decide(inputs(allow_scaling=True, dp_size=2, new_dp_size=1))
    assert d.costs_gpu_s["restart_scaled"] == 7830.0 * 16 / 2
    d = decide(inputs(allow_scaling=True, dp_size=3, new_dp_size=2))
    assert d.costs_gpu_s["restart_scaled"] == d.costs_s["restart_scaled"] * 16 * 2 / 3  # type: ignore[operator]


# -- the slowdown factor --------------------------------------------------------------------------
def test_k_estimates_say_where_they_came_from() -> None:
    measured = estimate_k(measured_k=1.0, comm_share=None, bandwidth_left=None, concurrent_faults=1)
    assert measured == SlowdownEstimate(1.0, KSource.MEASURED, "measured by the job")
    with pytest.raises(ValueError, match=r"^measured k must be >= 1, got 0.99$"):
        estimate_k(measured_k=0.99, comm_share=None, bandwidth_left=None, concurrent_faults=1)
    model = estimate_k(measured_k=None, comm_share=0.25, bandwidth_left=0.5, concurrent_faults=1)
    assert model == SlowdownEstimate(
        0.75 + 0.25 / 0.5, KSource.MODEL, "communication share 25% at 50% of the bandwidth"
    )
    default = estimate_k(
        measured_k=None,
        comm_share=None,
        bandwidth_left=None,
        concurrent_faults=2,
        table=(1.1, 1.4),
    )
    assert default == SlowdownEstimate(
        1.4, KSource.DEFAULT, "paper default for 2 concurrent fault(s)"
    )
    assert default_k(5, (1.1, 1.4)) == 1.4


def test_modelled_k_bandwidth_bounds() -> None:
    assert modelled_k(0.5, 1.0) == 1.0
    with pytest.raises(ValueError, match=r"^bandwidth_left must be within \(0, 1\], got 1.5$"):
        modelled_k(0.5, 1.5)
    with pytest.raises(ValueError, match=r"^comm_share must be within \[0, 1\], got -0.1$"):
        modelled_k(-0.1, 0.5)


def test_saved_gpu_time_is_failover_against_the_cheapest_restart() -> None:
    costs = {"failover": 1530.0, "restart": 4230.0, "restart_scaled": 3000.0, "none": None}
    # The cheaper of the two restarts is the one failing over is measured against.
    assert saved_gpu_s("failover", costs, 16, moved=True) == 16 * 1470.0
    assert saved_gpu_s("failover", costs | {"restart_scaled": None}, 16, moved=True) == 16 * 2700.0
    # A re-decision that moved no rank, and every other action, saved nothing.
    assert saved_gpu_s("failover", costs, 16, moved=False) == 0.0
    for action in ("restart", "restart_scaled", "none", "failback"):
        assert saved_gpu_s(action, costs, 16, moved=True) == 0.0
    # A failover dearer than restarting (a planned move) saves nothing, not less.
    assert saved_gpu_s("failover", costs | {"failover": 5000.0}, 16, moved=True) == 0.0
    assert saved_gpu_s("failover", {}, 16, moved=True) == 0.0
    # Without a failover cost, or without any restart cost, there is nothing to compare.
    assert saved_gpu_s("failover", costs | {"failover": None}, 16, moved=True) == 0.0
    assert saved_gpu_s("failover", {"failover": 1530.0, "restart": None}, 16, moved=True) == 0.0
    # Summed exactly: the same total in any order.
    parts = [0.1, 0.2, 0.3, 1e16, -1e16]
    assert total_saved_gpu_s(parts) == total_saved_gpu_s(reversed(parts)) == 0.6
