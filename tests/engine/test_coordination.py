"""Mitigation choice, switch points, flap damping, correlation and measured k."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduler_svc.engine.coordination import (
    Mitigation,
    PortFault,
    PortState,
    allreduce_handoff,
    balance_weights,
    infer_switch_failures,
    is_node_failure,
    measured_k,
    plan_mitigation,
    port_health,
    restart_at_checkpoint,
    switch_point,
)

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_allreduce_handoff_matches_the_papers_example() -> None:
    # 7 of 8 rails left, many nodes: the degraded node moves 1.75·D instead of 2·D.
    h = allreduce_handoff(7 / 8, 10_000)
    assert 2 * (1 - h) == pytest.approx(1.75, abs=1e-3)
    assert allreduce_handoff(1.0, 16) == 0.0
    assert allreduce_handoff(0.5, 1) == 0.0
    with pytest.raises(ValueError, match="bandwidth_left"):
        allreduce_handoff(0.0, 4)


def test_balance_weights_are_proportional() -> None:
    assert balance_weights({"n1": 8, "n0": 7}) == {"n0": 7 / 15, "n1": 8 / 15}
    with pytest.raises(ValueError, match="no bandwidth"):
        balance_weights({"n0": 0})


@pytest.mark.parametrize(
    ("kwargs", "chosen"),
    [
        # Large group: 8 rails, 16 channels, one rail lost. Balance with the
        # allreduce split beats disabling channels, which beats sharing.
        ({"rails_per_node": 8, "failed_rails": 1, "channels": 16, "nodes": 64}, Mitigation.BALANCE),
        # Small group on one rail: only s-Bond or NVL; NVL wins when the
        # s-Bond backup crosses root complexes.
        (
            {
                "rails_per_node": 1,
                "failed_rails": 1,
                "channels": 4,
                "nodes": 2,
                "nvl_available": True,
                "backup_crosses_root_complex": True,
            },
            Mitigation.NVL,
        ),
        ({"rails_per_node": 1, "failed_rails": 1, "channels": 4, "nodes": 2}, Mitigation.SBOND),
        # Two nodes: balancing gains little from the split; DCR ties are broken by order.
        ({"rails_per_node": 2, "failed_rails": 1, "channels": 2, "nodes": 2}, Mitigation.BALANCE),
    ],
)
def test_mitigation_choice(kwargs: dict[str, object], chosen: Mitigation) -> None:
    plan = plan_mitigation(comm_share=0.3, **kwargs)  # type: ignore[arg-type]
    assert plan.chosen.mitigation == chosen
    assert plan.reason.startswith(chosen.value)
    applicable = [o for o in plan.options if o.applicable]
    assert plan.chosen.k == min(o.k for o in applicable if o.k is not None)


def test_dcr_not_applicable_says_why() -> None:
    plan = plan_mitigation(comm_share=0.3, rails_per_node=1, failed_rails=1, channels=8, nodes=4)
    dcr = next(o for o in plan.options if o.mitigation == Mitigation.DCR)
    assert not dcr.applicable and "disjoint" in dcr.why
    nvl = next(o for o in plan.options if o.mitigation == Mitigation.NVL)
    assert not nvl.applicable and "NVLink" in nvl.why
    capped = plan_mitigation(
        comm_share=0.3, rails_per_node=1, failed_rails=1, channels=32, nodes=4, nvl_available=True
    )
    nvl = next(o for o in capped.options if o.mitigation == Mitigation.NVL)
    assert not nvl.applicable and "cap" in nvl.why


def test_dcr_k_follows_disabled_share() -> None:
    plan = plan_mitigation(comm_share=0.5, rails_per_node=4, failed_rails=1, channels=8, nodes=2)
    dcr = next(o for o in plan.options if o.mitigation == Mitigation.DCR)
    assert dcr.detail["disabled_channels"] == 2
    assert dcr.k == pytest.approx(1 + 0.5 * (8 / 6 - 1))


@pytest.mark.parametrize(
    ("rate", "latency", "minimum", "expected_offset"),
    [(None, 0.1, 50, 50), (100.0, 0.05, 5, 10), (1000.0, 0.2, 50, 400), (1.0, 0.01, 20, 20)],
)
def test_switch_point(
    rate: float | None, latency: float, minimum: int, expected_offset: int
) -> None:
    sp = switch_point(
        max_ops_done=1000, op_rate_per_s=rate, delivery_latency_s=latency, min_offset=minimum
    )
    assert sp.offset == expected_offset
    assert sp.ops_done == 1000 + expected_offset


def test_single_flap_fails_back_after_damping() -> None:
    history = [(at(0), False), (at(3), True)]
    damping = port_health(history, at(5), damping_s=10, max_flaps=4, window_s=600)
    assert damping.state == PortState.DAMPING and damping.failback_at == at(13)
    healthy = port_health(history, at(13), damping_s=10, max_flaps=4, window_s=600)
    assert healthy.state == PortState.HEALTHY
    assert (
        port_health(history[:1], at(1), damping_s=10, max_flaps=4, window_s=600).state
        == PortState.DOWN
    )


def test_five_flaps_in_ten_minutes_flag_the_port() -> None:
    history = [(at(i * 60 + d), up) for i in range(5) for d, up in ((0, False), (5, True))]
    h = port_health(history, at(5 * 60 + 100), damping_s=10, max_flaps=4, window_s=600)
    assert h.state == PortState.FLAPPING and h.downs_in_window == 5
    # The same five downs spread over more than the window are ordinary flaps.
    spread = [(at(i * 300 + d), up) for i in range(5) for d, up in ((0, False), (5, True))]
    assert (
        port_health(spread, at(1300), damping_s=10, max_flaps=4, window_s=600).state
        == PortState.HEALTHY
    )


def test_switch_inferred_from_three_nodes_within_window() -> None:
    faults = [PortFault(f"n{i}", "mlx5_3", 1, "rail3", at(i * 0.5)) for i in range(3)]
    faults.append(PortFault("n0", "mlx5_1", 1, "rail1", at(0)))
    (found,) = infer_switch_failures(faults, window_s=2, min_nodes=3)
    assert found.switch == "rail3" and found.nodes == ("n0", "n1", "n2")
    slow = [PortFault(f"n{i}", "mlx5_3", 1, "rail3", at(i * 5)) for i in range(3)]
    assert infer_switch_failures(slow, window_s=2, min_nodes=3) == []
    same_node = [PortFault("n0", f"mlx5_{d}", 1, "rail3", at(0)) for d in range(3)]
    assert infer_switch_failures(same_node, window_s=2, min_nodes=3) == []


def test_node_failure_needs_every_fabric_port() -> None:
    ports = [(f"mlx5_{i}", 1) for i in range(8)]
    assert is_node_failure(ports, ports)
    assert not is_node_failure(ports[:7], ports)
    assert not is_node_failure([], [])


def test_measured_k() -> None:
    base, deg = [1.0] * 6, [1.10, 1.12, 1.11, 1.10, 1.09, 1.11]
    m = measured_k(base, deg)
    assert m.trustworthy and m.k == pytest.approx(1.105)
    assert not measured_k(base, deg[:3]).trustworthy
    noisy = measured_k(base, [1.0, 2.0, 1.1, 3.0, 1.2, 2.5])
    assert not noisy.trustworthy and "spread" in noisy.reason


@pytest.mark.parametrize(
    ("k", "reload_s", "repair_s", "restart"),
    [
        (1.03, 1800, 86400, True),
        (1.03, 1800, 3600, False),
        (1.5, 600, 1000, False),
        (1.5, 600, 1300, True),
    ],
)
def test_restart_at_checkpoint(k: float, reload_s: float, repair_s: float, restart: bool) -> None:
    decided, reason = restart_at_checkpoint(k=k, reload_s=reload_s, repair_s=repair_s)
    assert decided == restart
    assert reason.startswith("restart" if restart else "keep running")


def test_restart_at_checkpoint_counts_the_spares_price_with_the_reload() -> None:
    """1,300 s of repair at k=1.5 lose 650 s degraded: a 600 s reload restarts, unless the
    spare it takes is worth 50 s or more to the faults only a replacement fixes."""
    assert restart_at_checkpoint(k=1.5, reload_s=600, repair_s=1300, spare_price_s=49)[0]
    kept, reason = restart_at_checkpoint(k=1.5, reload_s=600, repair_s=1300, spare_price_s=50)
    assert not kept
    assert reason == (
        "keep running degraded: 650 s lost until the repair in 1300 s (k=1.500) <= reload "
        "600 s + 50 s the spare is worth to lost GPUs and dead nodes"
    )
    small = restart_at_checkpoint(k=1.5, reload_s=600, repair_s=1300, spare_price_s=0.4)
    assert small[1].endswith("< 650 s lost running degraded (k=1.500) until the repair in 1300 s")
    assert "reload 600 s + 0 s the spare is worth" in small[1]  # priced, however little
