"""Routing ranks the service cannot place, and the planned-maintenance decision's text."""

from __future__ import annotations

from typing import Any

from scheduler_svc.engine.decision import Action, DecisionInputs, decide
from scheduler_svc.engine.paths import FailedSet, Gpu, NodeTopology, Rnic, plan_node
from scheduler_svc.engine.routes import RankRoute, route_ranks


def node(name: str) -> NodeTopology:
    gpus = (Gpu(0, "g0", numa=0, pcie_switch="p0"), Gpu(1, "g1", numa=0, pcie_switch="p1"))
    rnics = (
        Rnic("mlx5_0", 1, numa=0, pcie_switch="p0", switch="s0", rail=0),
        Rnic("mlx5_1", 1, numa=0, pcie_switch="p1", switch="s1", rail=1),
    )
    return NodeTopology(name, gpus, rnics)


def test_unknown_node_gpu_or_topology_gets_no_path_and_routing_goes_on() -> None:
    a, b = node("a"), node("b")
    plans = {"a": plan_node(a), "b": plan_node(b)}
    topologies = {"a": a}  # b is planned but its topology is not known
    ranks = [(0, "zz", 0), (1, "a", 9), (2, "b", 0), (3, "a", 0), (4, "a", 1)]
    got = route_ranks(ranks, plans, topologies, FailedSet())
    assert got == [
        RankRoute(0, "zz", 0, None, None, False, False, None),
        RankRoute(1, "a", 9, None, None, False, False, None),
        RankRoute(2, "b", 0, None, None, False, False, None),
        RankRoute(3, "a", 0, "mlx5_0/1", "mlx5_1/1", True, True, 0),
        RankRoute(4, "a", 1, "mlx5_1/1", "mlx5_0/1", True, True, 1),
    ]
    for r in got[:3]:
        assert r.primary_ok is False and r.backup_ok is False
        assert r.active is None


def test_planned_maintenance_fails_over_with_its_own_reason() -> None:
    d = decide(
        DecisionInputs(
            checkpoint_interval_s=3600.0,
            elapsed_s=10.0,
            detect_s=0.0,
            reload_s=600.0,
            timeout_s=30.0,
            k=1.5,
            k_source="measured",
            gpus=8,
            planned=True,
        )
    )
    assert d.action == Action.FAILOVER
    assert d.reason == (
        "fail over ahead of it: every GPU keeps a path, so the ranks move to their "
        "backups before the window opens and nothing restarts"
    )


def test_unplanned_restart_names_the_cheapest_restart() -> None:
    base: dict[str, Any] = {
        "checkpoint_interval_s": 3600.0,
        "elapsed_s": 0.0,
        "detect_s": 0.0,
        "reload_s": 600.0,
        "timeout_s": 30.0,
        "k": 1.5,
        "k_source": "measured",
        "gpus": 8,
    }
    plain = decide(DecisionInputs(**base))
    assert plain.action == Action.RESTART
    assert plain.reason == (
        "restart: only 0 s since the last checkpoint, before the 20.0 min threshold at "
        "k=1.5: restart costs 1.18 h, failing over 1.68 h"
    )
    scaled = decide(
        DecisionInputs(
            **base,
            dp_size=8,
            new_dp_size=7,
            allow_scaling=True,
            spare_nodes=False,
            node_replace_s=7200.0,
        )
    )
    assert scaled.action == Action.RESTART_SCALED
    assert scaled.reason.startswith("restart_scaled: only 0 s since the last checkpoint")
