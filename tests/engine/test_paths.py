"""s-Bond backup choice and rank-pair survival."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from railover_testing.cluster_shapes import hgx_node
from scheduler_svc.engine.paths import FailedSet, Gpu, NodeTopology, Rnic, placement_cost, plan_node
from scheduler_svc.engine.routes import (
    bandwidth_left,
    connectivity,
    pair_survives,
    route_ranks,
    talks_over_fabric,
)


def topo(name: str, body: dict[str, Any]) -> NodeTopology:
    return NodeTopology(
        name,
        tuple(Gpu(**g) for g in body["gpus"]),
        tuple(
            Rnic(**{k: v for k, v in r.items() if k not in ("link_layer", "netdev")})
            for r in body["rnics"]
        ),
    )


@pytest.mark.parametrize(
    ("gpu", "rnic", "cost"),
    [
        (
            Gpu(0, "a", 0, "sw0", "rc0"),
            Rnic("r", 1, numa=0, pcie_switch="sw0", root_complex="rc0"),
            0,
        ),
        (
            Gpu(0, "a", 0, "sw0", "rc0"),
            Rnic("r", 1, numa=0, pcie_switch="sw1", root_complex="rc0"),
            1,
        ),
        (
            Gpu(0, "a", 0, "sw0", "rc0"),
            Rnic("r", 1, numa=0, pcie_switch="sw1", root_complex="rc1"),
            101,
        ),
        (
            Gpu(0, "a", 0, "sw0", "rc0"),
            Rnic("r", 1, numa=1, pcie_switch="sw1", root_complex="rc1"),
            301,
        ),
        (Gpu(0, "a", None, None, None), Rnic("r", 1), 301),
    ],
)
def test_placement_cost(gpu: Gpu, rnic: Rnic, cost: int) -> None:
    assert placement_cost(gpu, rnic) == cost


def test_hgx_node_pairs_gpus_behind_each_switch() -> None:
    plan = plan_node(topo("n0", hgx_node()))
    assert not plan.warnings
    for g in plan.gpus:
        assert g.primary == f"mlx5_{g.gpu}/1"
        partner = g.gpu ^ 1  # the other RNIC behind the same PCIe switch
        assert g.backup == f"mlx5_{partner}/1"
        assert g.backup_cost == 0
        assert g.rail_disjoint


def test_cap_spreads_backups_when_rnics_are_scarce() -> None:
    # 8 GPUs, 4 RNICs, one per PCIe switch: primaries are shared by two GPUs,
    # and backups must leave the switch; the cap keeps each switch at 2 backups.
    body = hgx_node(rails=4)
    plan = plan_node(topo("n0", body))
    backups = [g.backup for g in plan.gpus]
    per_rnic = {b: backups.count(b) for b in set(backups)}
    assert set(per_rnic.values()) == {2}
    for g in plan.gpus:
        assert g.primary != g.backup
        assert g.backup_cost == 1 + 100  # other switch and root complex, same NUMA


def test_storage_nics_are_never_chosen() -> None:
    body = hgx_node()
    body["rnics"].append(
        {
            "name": "mlx5_8",
            "port": 1,
            "numa": 0,
            "pcie_switch": "0000:11:00.0",
            "root_complex": "pci0000:10",
            "rate_gbps": 200,
            "switch": None,
            "rail": None,
        }
    )
    plan = plan_node(topo("n0", body))
    assert all("mlx5_8" not in (g.primary or "") + (g.backup or "") for g in plan.gpus)


def test_same_switch_backup_is_reported() -> None:
    body = hgx_node(switch_name="tor-a")  # every rail cabled to one switch
    plan = plan_node(topo("n0", body))
    assert len(plan.warnings) == 8
    assert "same fabric switch" in plan.warnings[0]


def test_single_rnic_has_no_backup() -> None:
    body = hgx_node(rails=1, gpus=2, switches=1, numa_nodes=1)
    plan = plan_node(topo("n0", body))
    assert all(g.backup is None for g in plan.gpus)
    assert "no backup" in plan.warnings[0]


def _job(failed: FailedSet, nodes: int = 2) -> Any:
    topologies = {f"n{i}": topo(f"n{i}", hgx_node()) for i in range(nodes)}
    plans = {n: plan_node(t) for n, t in topologies.items()}
    ranks = [(i * 8 + g, f"n{i}", g) for i in range(nodes) for g in range(8)]
    routes = route_ranks(ranks, plans, topologies, failed)
    return routes, connectivity(routes), topologies


def test_no_fault_every_pair_survives() -> None:
    routes, conn, topologies = _job(FailedSet())
    assert conn.all_pairs_survive
    assert conn.total_pairs == 8  # GPU i of n0 with GPU i of n1, one pair per rail
    assert bandwidth_left(routes, topologies) == 1.0


def test_one_link_down_fails_over() -> None:
    routes, conn, topologies = _job(FailedSet(links=frozenset({("n0", "mlx5_0", 1)})))
    assert conn.all_pairs_survive
    assert conn.failed_over_ranks == (0,)
    assert routes[0].active == "mlx5_1/1"
    assert bandwidth_left(routes, topologies) == pytest.approx(0.5)


def test_primary_and_backup_down_breaks_pairs() -> None:
    failed = FailedSet(rnics=frozenset({("n0", "mlx5_0"), ("n0", "mlx5_1")}))
    _, conn, _ = _job(failed)
    assert conn.isolated_ranks == (0, 1)
    assert conn.broken_pairs == 2  # rank 0 with rank 8 (rail 0), rank 1 with rank 9 (rail 1)
    assert not conn.all_pairs_survive


def test_switch_failure_moves_every_node_to_backups() -> None:
    _, conn, _ = _job(FailedSet(switches=frozenset({"rail0-leaf"})), nodes=4)
    assert conn.all_pairs_survive
    assert conn.failed_over_ranks == (0, 8, 16, 24)


def test_class_count_matches_brute_force() -> None:
    failed = FailedSet(
        links=frozenset({("n0", "mlx5_0", 1), ("n1", "mlx5_3", 1), ("n2", "mlx5_0", 1)}),
        rnics=frozenset({("n2", "mlx5_1")}),
    )
    routes, conn, _ = _job(failed, nodes=3)
    brute = sum(
        1
        for a, b in itertools.combinations(routes, 2)
        if talks_over_fabric(a, b) and not pair_survives(a, b)
    )
    assert conn.broken_pairs == brute > 0
    assert all(not pair_survives(routes[a], routes[b]) for a, b in conn.examples)
