"""Coordination's pure functions at their boundaries, with every option and reason exact."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from scheduler_svc.engine.coordination import (
    MeasuredK,
    Mitigation,
    Option,
    PortFault,
    PortHealth,
    PortState,
    SwitchFailure,
    SwitchPoint,
    allreduce_handoff,
    balance_weights,
    infer_switch_failures,
    measured_k,
    plan_mitigation,
    port_health,
    restart_at_checkpoint,
    switch_point,
)

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


# -- allreduce hand-off and balance ---------------------------------------------------------------
def test_handoff_formula() -> None:
    # h = (1 − f) / (1 + f/(N − 1)); f = 1/2, N = 3: 0.5 / 1.25.
    assert allreduce_handoff(0.5, 3) == 0.4
    assert allreduce_handoff(0.5, 2) == 0.5 / 1.5
    assert allreduce_handoff(1.0, 2) == 0.0


@pytest.mark.parametrize("f", [0.0, -0.1, 1.01, 1.5, 2.0])
def test_handoff_refuses_fractions_outside_0_1(f: float) -> None:
    with pytest.raises(ValueError, match=rf"^bandwidth_left must be within \(0, 1\], got {f}$"):
        allreduce_handoff(f, 4)


def test_balance_weights_of_small_totals() -> None:
    assert balance_weights({"b": 0.25, "a": 0.25}) == {"a": 0.5, "b": 0.5}
    assert list(balance_weights({"b": 0.25, "a": 0.75})) == ["a", "b"]
    with pytest.raises(ValueError, match=r"^no bandwidth left on any node$"):
        balance_weights({"a": 0.0})


# -- mitigation plans -----------------------------------------------------------------------------
def test_plan_with_every_option_spelled_out() -> None:
    s = 0.5
    plan = plan_mitigation(
        comm_share=s,
        rails_per_node=4,
        failed_rails=1,
        channels=8,
        nodes=3,
        backup_load=3,
        nvl_available=True,
    )
    f = 3 / 4
    h = (1 - f) / (1 + f / 2)
    assert plan.options == (
        Option(
            Mitigation.SBOND,
            True,
            1 + s * (3 - 1),
            "the busiest backup RNIC carries 3 rails' traffic",
            {"load": 3},
        ),
        Option(
            Mitigation.DCR,
            True,
            1 + s * (8 / 6 - 1),
            "disable 2 of 8 channels; the rest use disjoint RNICs",
            {"disabled_channels": 2},
        ),
        Option(
            Mitigation.NVL,
            True,
            1 + s * (3 - 1),
            "transit over NVLink to a peer GPU's RNIC (320 MB of GPU memory)",
            {"gpu_memory_mb": 320.0},
        ),
        Option(
            Mitigation.BALANCE,
            True,
            1 + s * ((1 - h) / f - 1),
            "weights by bandwidth left (75% on the degraded node), "
            f"which hands off {h:.1%} of each allreduce",
            {"bandwidth_left": f, "allreduce_handoff": h},
        ),
    )
    assert plan.options[3].why.endswith("which hands off 18.2% of each allreduce")
    assert plan.chosen is plan.options[3]
    assert plan.reason == (
        f"balance (k={plan.options[3].k:.3f}): {plan.options[3].why}; "
        "beats s-bond k=2.000, dcr k=1.167, nvl k=2.000"
    )


def test_defaults_and_the_cross_root_complex_penalty() -> None:
    plan = plan_mitigation(comm_share=0.5, rails_per_node=1, failed_rails=1, channels=4, nodes=2)
    # Defaults: the busiest backup carries 2 rails, within one root complex; no NVLink.
    assert plan.options == (
        Option(
            Mitigation.SBOND,
            True,
            1.5,
            "the busiest backup RNIC carries 2 rails' traffic",
            {"load": 2},
        ),
        Option(
            Mitigation.DCR,
            False,
            None,
            "channels do not use disjoint RNICs (the communicator has one rail per node)",
        ),
        Option(Mitigation.NVL, False, None, "no peer GPU with NVLink and a healthy RNIC"),
        Option(Mitigation.BALANCE, False, None, "no surviving rail to balance onto"),
    )
    assert plan.chosen.mitigation == Mitigation.SBOND
    assert plan.reason == "s-bond (k=1.500): the busiest backup RNIC carries 2 rails' traffic"
    crossing = plan_mitigation(
        comm_share=0.5,
        rails_per_node=1,
        failed_rails=1,
        channels=4,
        nodes=2,
        backup_crosses_root_complex=True,
    )
    # 2 rails at half the PCIe throughput: as if 4 shared it.
    assert crossing.options[0] == Option(
        Mitigation.SBOND,
        True,
        1 + 0.5 * (4 - 1),
        "the busiest backup RNIC carries 2 rails' traffic, across root complexes",
        {"load": 2},
    )


def test_nvlink_memory_cap_and_default_buffer_size() -> None:
    def nvl(**kw: float | int) -> Option:
        args: dict[str, object] = {
            "comm_share": 0.5,
            "rails_per_node": 1,
            "failed_rails": 1,
            "nodes": 2,
            "nvl_available": True,
        }
        args.update(kw)
        return plan_mitigation(**args).options[2]  # type: ignore[arg-type]

    # 40 MB per channel by default, 512 MB at most.
    assert nvl(channels=12).why == "transit over NVLink to a peer GPU's RNIC (480 MB of GPU memory)"
    assert nvl(channels=13) == Option(
        Mitigation.NVL, False, None, "needs 520 MB of GPU memory, over the 512 MB cap"
    )
    exactly_at_cap = nvl(channels=16, nvl_mb_per_channel=32.0)
    assert exactly_at_cap.applicable
    assert exactly_at_cap.detail == {"gpu_memory_mb": 512.0}


def test_dcr_and_balance_boundaries() -> None:
    def options(rails: int, failed: int, channels: int) -> tuple[Option, ...]:
        return plan_mitigation(
            comm_share=0.5, rails_per_node=rails, failed_rails=failed, channels=channels, nodes=4
        ).options

    # Two rails, one failed, two channels: one channel left, on the surviving rail.
    dcr, balance = options(2, 1, 2)[1], options(2, 1, 2)[3]
    assert (dcr.applicable, dcr.k, dcr.detail) == (True, 1.5, {"disabled_channels": 1})
    assert balance.applicable
    # Every channel on the failed rail: nothing to spread onto.
    assert not options(2, 1, 1)[1].applicable
    # Every rail failed: neither DCR nor balance.
    assert [o.applicable for o in options(2, 2, 4)] == [True, False, False, False]
    # One rail and it is healthy: there is no second rail to balance onto.
    assert [o.applicable for o in options(1, 0, 4)] == [True, False, False, False]
    # No failed rail at all is a valid (if idle) question.
    assert options(4, 0, 4)[1] == Option(
        Mitigation.DCR,
        True,
        1.0,
        "disable 0 of 4 channels; the rest use disjoint RNICs",
        {"disabled_channels": 0},
    )


@pytest.mark.parametrize(("rails", "failed"), [(0, 0), (1, 2), (2, -1)])
def test_plan_refuses_impossible_rail_counts(rails: int, failed: int) -> None:
    with pytest.raises(
        ValueError,
        match=r"^need 1 <= rails_per_node and 0 <= failed_rails <= rails_per_node$",
    ):
        plan_mitigation(
            comm_share=0.5, rails_per_node=rails, failed_rails=failed, channels=4, nodes=2
        )


def test_tie_goes_to_the_first_mitigation() -> None:
    # s-Bond and NVL predict the same k; s-Bond is listed first and wins.
    plan = plan_mitigation(
        comm_share=0.5,
        rails_per_node=1,
        failed_rails=1,
        channels=4,
        nodes=2,
        nvl_available=True,
    )
    assert plan.options[0].k == plan.options[2].k == 1.5
    assert plan.chosen.mitigation == Mitigation.SBOND
    assert plan.reason == (
        "s-bond (k=1.500): the busiest backup RNIC carries 2 rails' traffic; beats nvl k=1.500"
    )


# -- switch points --------------------------------------------------------------------------------
def test_switch_point_reasons() -> None:
    assert switch_point(
        max_ops_done=100, op_rate_per_s=None, delivery_latency_s=0.25, min_offset=20
    ) == SwitchPoint(120, 20, "op rate unknown: minimum offset")
    assert switch_point(
        max_ops_done=100, op_rate_per_s=0.0, delivery_latency_s=0.25, min_offset=20
    ) == SwitchPoint(120, 20, "op rate unknown: minimum offset")
    # A slow job (1 op/s) still has a known rate.
    assert switch_point(
        max_ops_done=100, op_rate_per_s=1.0, delivery_latency_s=0.25, min_offset=20
    ) == SwitchPoint(120, 20, "1.0 ops/s x 250 ms delivery x 2")
    assert switch_point(
        max_ops_done=100, op_rate_per_s=400.0, delivery_latency_s=0.25, min_offset=20, safety=1.5
    ) == SwitchPoint(250, 150, "400.0 ops/s x 250 ms delivery x 1.5")
    assert switch_point(
        max_ops_done=0, op_rate_per_s=10.0, delivery_latency_s=1.0, min_offset=1
    ) == SwitchPoint(20, 20, "10.0 ops/s x 1000 ms delivery x 2")


# -- port health ----------------------------------------------------------------------------------
def health(transitions: Sequence[tuple[float, bool]], now: float, max_flaps: int = 2) -> PortHealth:
    return port_health(
        [(at(t), up) for t, up in transitions],
        at(now),
        damping_s=60,
        max_flaps=max_flaps,
        window_s=600,
    )


def test_port_health_in_each_state() -> None:
    assert health([], 0) == PortHealth(PortState.HEALTHY, 0, None, "no transitions")
    assert health([(0, False)], 10) == PortHealth(PortState.DOWN, 1, None, "port is down")
    assert health([(0, False), (10, True)], 30) == PortHealth(
        PortState.DAMPING, 1, at(70), f"up since {at(10).isoformat()}, damping 60 s"
    )
    assert health([(0, False), (10, True)], 70) == PortHealth(
        PortState.HEALTHY, 1, at(70), "up and quiet for 60 s"
    )


def test_flapping_counts_downs_only_and_exactly_more_than_the_limit() -> None:
    two_downs = [(0, False), (5, True), (10, False), (15, True)]
    # Two downs with max_flaps=2 is not flapping (more than the limit flags it).
    assert health(two_downs, 100).state == PortState.HEALTHY
    # Ups are not counted: many ups and one down is one down.
    assert health([(0, True), (1, True), (2, True), (3, False)], 10, max_flaps=1) == PortHealth(
        PortState.DOWN, 1, None, "port is down"
    )
    three = [*two_downs, (20, False), (25, True)]
    assert health(three, 100) == PortHealth(
        PortState.FLAPPING, 3, None, "3 downs in 600 s (more than 2): stays on its backup"
    )
    # A down exactly at the start of the window still counts; one before it does not.
    assert health(three, 600).downs_in_window == 3
    assert health(three, 600.5).downs_in_window == 2


# -- correlation ----------------------------------------------------------------------------------
def test_a_fault_exactly_at_the_window_end_counts() -> None:
    faults = [
        PortFault("n0", "mlx5_0", 1, "leaf0", at(0)),
        PortFault("n1", "mlx5_0", 1, "leaf0", at(5)),
        PortFault("n2", "mlx5_0", 1, "leaf0", at(10)),
    ]
    assert infer_switch_failures(faults, window_s=10, min_nodes=3) == [
        SwitchFailure(
            "leaf0", ("n0", "n1", "n2"), at(0), "3 nodes lost their port on leaf0 within 10 s"
        )
    ]
    assert infer_switch_failures(faults, window_s=9.5, min_nodes=3) == []


# -- measured k -----------------------------------------------------------------------------------
def test_measured_k_with_exactly_the_samples_it_needs() -> None:
    got = measured_k([1.0] * 5, [1.5] * 5)
    assert got == MeasuredK(1.5, True, "median 1.500 s vs 1.000 s healthy")
    assert measured_k([1.0] * 4, [1.5] * 5) == MeasuredK(
        None, False, "4 healthy and 5 degraded samples; need 5 each"
    )
    assert measured_k([1.0] * 5, [1.5] * 4) == MeasuredK(
        None, False, "5 healthy and 4 degraded samples; need 5 each"
    )
    assert measured_k([1.0] * 3, [1.5] * 3, min_samples=3).trustworthy


def test_measured_k_ratio_and_floor() -> None:
    assert measured_k([2.0] * 5, [3.0] * 5).k == 1.5
    # Faster while degraded (noise): never below 1.
    assert measured_k([2.0] * 5, [1.0] * 5).k == 1.0


def test_sub_second_iterations_are_measured() -> None:
    assert measured_k([0.25] * 5, [0.5] * 5) == MeasuredK(
        2.0, True, "median 0.500 s vs 0.250 s healthy"
    )


def test_healthy_time_not_positive() -> None:
    assert measured_k([0.0] * 5, [1.0] * 5) == MeasuredK(
        None, False, "healthy iteration time is not positive"
    )


def test_degraded_time_zero_is_never_steady() -> None:
    got = measured_k([1.0] * 5, [0.0] * 5)
    assert got.k == 1.0
    assert not got.trustworthy
    assert got.reason == "degraded times spread inf% > 25%"
    assert math.isinf(float(got.reason.split()[3].rstrip("%")))


def test_spread_is_the_interquartile_range_over_the_median() -> None:
    # quantiles(n=4) of 1..9 (exclusive method): 2.5, 5, 7.5: IQR 5 over median 5 = 100%.
    degraded = [float(x) for x in range(1, 10)]
    got = measured_k([1.0] * 5, degraded, max_spread=2.0)
    assert got == MeasuredK(5.0, True, "median 5.000 s vs 1.000 s healthy")
    got = measured_k([1.0] * 5, degraded, max_spread=0.99)
    assert got == MeasuredK(5.0, False, "degraded times spread 100% > 99%")
    # Spread equal to the limit is still steady.
    assert measured_k([1.0] * 5, [2.0] * 5, max_spread=0.0).trustworthy


# -- restart at a checkpoint ----------------------------------------------------------------------
def test_restart_at_checkpoint_tie_keeps_running() -> None:
    # k = 1.5 for 1200 s until the repair loses 600 s: equal to the reload, keep running.
    assert restart_at_checkpoint(k=1.5, reload_s=600, repair_s=1200) == (
        False,
        "keep running degraded: 600 s lost until the repair in 1200 s (k=1.500) <= reload 600 s",
    )
    assert restart_at_checkpoint(k=1.5, reload_s=599, repair_s=1200) == (
        True,
        "restart at this checkpoint: reload 599 s < 600 s lost running degraded (k=1.500) "
        "until the repair in 1200 s",
    )
