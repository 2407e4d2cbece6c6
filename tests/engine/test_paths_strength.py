"""s-Bond planning on the second shape (dual-port RNICs, 4 cards for 8 GPUs, storage NICs).

A backup on another port of the primary's own card would share the card's
fate, so it is never chosen, even though it is the nearest port there is.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railover_testing.cluster_shapes import dual_port_node, hgx_node
from scheduler_svc.engine.paths import (
    COST_OTHER_NUMA,
    COST_OTHER_PCIE_SWITCH,
    COST_OTHER_ROOT_COMPLEX,
    FailedSet,
    Gpu,
    GpuPaths,
    NodePlan,
    NodeTopology,
    Rnic,
    default_backup_cap,
    plan_node,
)
from scheduler_svc.engine.routes import (
    RankRoute,
    bandwidth_left,
    connectivity,
    pair_survives,
    route_ranks,
    talks_over_fabric,
)
from tests.engine.test_paths import topo


def card(key: str) -> str:
    return key.split("/", maxsplit=1)[0]


def test_cost_constants_are_reccls() -> None:
    assert (COST_OTHER_PCIE_SWITCH, COST_OTHER_ROOT_COMPLEX, COST_OTHER_NUMA) == (1, 100, 200)


def test_dual_port_backup_is_never_on_the_primarys_card() -> None:
    node = topo("n0", dual_port_node())
    plan = plan_node(node)
    assert plan.backup_cap_per_switch == 2  # 8 GPUs over 4 switches with fabric ports
    assert plan.warnings == ()
    got = [(g.gpu, g.primary, g.backup, g.primary_cost, g.backup_cost) for g in plan.gpus]
    assert got == [
        (0, "mlx5_0/1", "mlx5_1/1", 0, 1),
        (1, "mlx5_0/2", "mlx5_1/2", 0, 1),
        (2, "mlx5_1/1", "mlx5_0/1", 0, 1),
        (3, "mlx5_1/2", "mlx5_0/2", 0, 1),
        (4, "mlx5_2/1", "mlx5_3/1", 0, 1),
        (5, "mlx5_2/2", "mlx5_3/2", 0, 1),
        (6, "mlx5_3/1", "mlx5_2/1", 0, 1),
        (7, "mlx5_3/2", "mlx5_2/2", 0, 1),
    ]
    for g in plan.gpus:
        assert g.primary is not None and g.backup is not None
        assert card(g.backup) != card(g.primary)
        assert g.rail_disjoint
    # Storage NICs (no rail) carry no GPU traffic and are never a path.
    assert {card(k) for g in plan.gpus for k in (g.primary, g.backup) if k} == {
        "mlx5_0",
        "mlx5_1",
        "mlx5_2",
        "mlx5_3",
    }


def test_losing_one_dual_port_card_keeps_every_pair() -> None:
    """The whole card fails (both ports): every GPU it served fails over, none is cut off."""
    topologies = {n: topo(n, dual_port_node()) for n in ("a", "b")}
    plans = {n: plan_node(t) for n, t in topologies.items()}
    ranks = [(8 * i + g, n, g) for i, n in enumerate(("a", "b")) for g in range(8)]
    failed = FailedSet(rnics=frozenset({("a", "mlx5_0")}))
    routes = route_ranks(ranks, plans, topologies, failed)
    c = connectivity(routes)
    assert c.all_pairs_survive
    assert c.broken_pairs == 0
    # Same-rail pairs across the two nodes: 8 rails, one pair each.
    assert c.total_pairs == 8
    # GPUs 0 and 1 of node a used mlx5_0's two ports; GPUs 2 and 3 back up onto it.
    assert c.failed_over_ranks == (0, 1)
    assert [(r.rank, r.primary_ok, r.backup_ok) for r in routes[:4]] == [
        (0, False, True),
        (1, False, True),
        (2, True, False),
        (3, True, False),
    ]
    # Failed over, GPU 0 shares mlx5_1/1 with GPU 2: half its bandwidth.
    assert bandwidth_left(routes, topologies) == 0.5


def test_one_port_of_a_card_down_moves_only_its_gpu() -> None:
    topologies = {n: topo(n, dual_port_node()) for n in ("a", "b")}
    plans = {n: plan_node(t) for n, t in topologies.items()}
    ranks = [(8 * i + g, n, g) for i, n in enumerate(("a", "b")) for g in range(8)]
    routes = route_ranks(ranks, plans, topologies, FailedSet(links=frozenset({("a", "mlx5_0", 2)})))
    assert [r.rank for r in routes if not r.primary_ok] == [1]
    assert [r.rank for r in routes if not r.backup_ok] == [3]
    assert routes[1].active == "mlx5_1/2"
    assert routes[3].active == "mlx5_1/2"
    assert connectivity(routes).all_pairs_survive


def test_backup_loss_alone_breaks_pairs_only_with_a_failed_over_peer() -> None:
    topologies = {n: topo(n, dual_port_node()) for n in ("a", "b")}
    plans = {n: plan_node(t) for n, t in topologies.items()}
    ranks = [(8 * i + g, n, g) for i, n in enumerate(("a", "b")) for g in range(8)]
    # a's mlx5_0/1 is GPU 0's primary and GPU 2's backup; b's mlx5_1/1 is GPU 0's backup
    # and GPU 2's primary. a0 is left with backup-to-backup only, b0 with primary-to-primary
    # only: that pair is cut; a2 and b2 (b2 failed over, a2's backup gone) likewise.
    failed = FailedSet(links=frozenset({("a", "mlx5_0", 1), ("b", "mlx5_1", 1)}))
    routes = route_ranks(ranks, plans, topologies, failed)
    c = connectivity(routes)
    assert c.broken_pairs == 2
    assert c.examples == ((0, 8), (2, 10))
    assert c.failed_over_ranks == (0, 10)
    assert c.isolated_ranks == ()
    assert not pair_survives(routes[0], routes[8])
    assert talks_over_fabric(routes[0], routes[8])


def test_default_cap_counts_switches_with_fabric_ports_only() -> None:
    assert default_backup_cap(topo("n", dual_port_node())) == 2
    assert default_backup_cap(topo("n", hgx_node(rails=4))) == 2
    assert default_backup_cap(topo("n", hgx_node(rails=8))) == 2
    assert default_backup_cap(topo("n", hgx_node(rails=8, switches=8))) == 1
    no_fabric = NodeTopology("n", (Gpu(0, "g"),), (Rnic("s", 1),))
    assert default_backup_cap(no_fabric) == 1
    assert plan_node(no_fabric).warnings == (
        "node n has no RNIC on the GPU fabric (none in the rail map)",
    )
    assert plan_node(no_fabric).gpus == (GpuPaths(0, None, None, None, None, None, None),)


def test_single_card_with_two_ports_has_no_backup() -> None:
    body = dual_port_node()
    body["rnics"] = [r for r in body["rnics"] if r["name"] == "mlx5_0"]
    plan = plan_node(topo("n0", body))
    assert all(g.backup is None for g in plan.gpus)
    assert plan.warnings[0] == "GPU 0 has no backup RNIC: mlx5_0 is the only fabric RNIC"
    assert len(plan.warnings) == 8


def test_full_switch_is_used_last_and_reported() -> None:
    # Two fabric cards, one port each, 4 GPUs behind card 0's switch: cap 4/2 = 2.
    gpus = tuple(Gpu(i, f"g{i}", 0, "sw0", "rc0") for i in range(4))
    rnics = (
        Rnic("mlx5_0", 1, numa=0, pcie_switch="sw0", root_complex="rc0", switch="s0", rail=0),
        Rnic("mlx5_1", 1, numa=0, pcie_switch="sw1", root_complex="rc0", switch="s1", rail=1),
    )
    plan = plan_node(NodeTopology("n", gpus, rnics), backup_cap_per_switch=1)
    assert plan.backup_cap_per_switch == 1
    assert [g.backup for g in plan.gpus] == ["mlx5_1/1"] * 4
    assert plan.warnings == tuple(
        f"GPU {i} backs up onto mlx5_1/1 although PCIe switch sw1 already carries 1 backups "
        "(no other choice)"
        for i in (1, 2, 3)
    )


def test_same_fabric_switch_warning_text() -> None:
    gpus = (Gpu(0, "g0", 0, "sw0", "rc0"),)
    rnics = (
        Rnic("mlx5_0", 1, numa=0, pcie_switch="sw0", root_complex="rc0", switch="leaf", rail=0),
        Rnic("mlx5_1", 1, numa=0, pcie_switch="sw1", root_complex="rc0", switch="leaf", rail=1),
    )
    plan = plan_node(NodeTopology("n", gpus, rnics))
    assert plan.warnings == (
        "GPU 0: backup mlx5_1/1 hangs off the same fabric switch leaf as primary mlx5_0/1; "
        "losing that switch loses both",
    )
    assert not plan.gpus[0].rail_disjoint


def test_for_gpu_and_rnic_lookups_name_what_is_missing() -> None:
    node = topo("n0", dual_port_node())
    plan = plan_node(node)
    assert plan.for_gpu(5).primary == "mlx5_2/2"
    with pytest.raises(KeyError, match="node n0 has no GPU 9"):
        plan.for_gpu(9)
    assert node.rnic("mlx5_3/2").rail == 7
    with pytest.raises(KeyError, match="node n0 has no RNIC port mlx5_0/3"):
        node.rnic("mlx5_0/3")


def test_failed_set_checks_card_port_and_switch() -> None:
    r = Rnic("mlx5_0", 2, switch="leaf1", rail=1)
    assert FailedSet().empty
    assert FailedSet().port_ok("n", r)
    assert not FailedSet(rnics=frozenset({("n", "mlx5_0")})).port_ok("n", r)
    assert FailedSet(rnics=frozenset({("m", "mlx5_0")})).port_ok("n", r)
    # Device "*": every RNIC of that node (an unreachable node, a node-wide window).
    assert not FailedSet(rnics=frozenset({("n", "*")})).port_ok("n", r)
    assert FailedSet(rnics=frozenset({("m", "*")})).port_ok("n", r)
    assert not FailedSet(links=frozenset({("n", "mlx5_0", 2)})).port_ok("n", r)
    assert FailedSet(links=frozenset({("n", "mlx5_0", 1)})).port_ok("n", r)
    assert not FailedSet(switches=frozenset({"leaf1"})).port_ok("n", r)
    assert FailedSet(switches=frozenset({"leaf1"})).port_ok("n", Rnic("mlx5_0", 2))
    assert not FailedSet(switches=frozenset({"x"})).empty
    assert not FailedSet(links=frozenset({("n", "a", 1)})).empty
    assert not FailedSet(rnics=frozenset({("n", "a")})).empty


def test_rank_route_active_endpoint() -> None:
    both = RankRoute(0, "n", 0, "p", "b", True, True)
    assert both.active == "p"
    assert RankRoute(0, "n", 0, "p", "b", False, True).active == "b"
    assert RankRoute(0, "n", 0, "p", "b", False, False).active is None
    assert RankRoute(0, "n", 0, "p", "b", True, False).active == "p"


def test_examples_are_capped_and_sorted() -> None:
    topologies = {n: topo(n, hgx_node()) for n in ("a", "b", "c")}
    plans = {n: plan_node(t) for n, t in topologies.items()}
    ranks = [(8 * i + g, n, g) for i, n in enumerate(("a", "b", "c")) for g in range(8)]
    # Every RNIC of node a dead: its 8 ranks are cut off from their 2 peers each.
    failed = FailedSet(rnics=frozenset(("a", f"mlx5_{i}") for i in range(8)))
    c = connectivity(route_ranks(ranks, plans, topologies, failed), max_examples=3)
    assert c.broken_pairs == 16
    assert c.total_pairs == 24
    assert c.isolated_ranks == tuple(range(8))
    assert c.examples == ((0, 8), (0, 16), (1, 9))
    c = connectivity(route_ranks(ranks, plans, topologies, failed), max_examples=1)
    assert c.examples == ((0, 8),)
    assert len(connectivity(route_ranks(ranks, plans, topologies, failed)).examples) == 10


def test_unhealthy_plan_keeps_route_when_nothing_failed() -> None:
    topologies = {"a": topo("a", dual_port_node())}
    plans = {"a": NodePlan("a", (GpuPaths(0, "mlx5_0/1", None, 0, None, "rail0-leaf", None),), 1)}
    (route,) = route_ranks([(0, "a", 0)], plans, topologies, FailedSet())
    assert (route.primary_ok, route.backup_ok, route.rail) == (True, False, 0)
    plans = {"a": NodePlan("a", (GpuPaths(0, None, None, None, None, None, None),), 1)}
    (route,) = route_ranks([(0, "a", 0)], plans, topologies, FailedSet())
    assert (route.primary_ok, route.backup_ok, route.rail) == (False, False, None)


def test_bandwidth_of_a_slower_backup() -> None:
    body = dual_port_node()
    for r in body["rnics"]:
        if r["name"] == "mlx5_1":
            r["rate_gbps"] = 100.0
    topologies = {"a": topo("a", body)}
    plans = {"a": plan_node(topologies["a"])}
    ranks = [(g, "a", g) for g in range(8)]
    healthy = route_ranks(ranks, plans, topologies, FailedSet())
    assert bandwidth_left(healthy, topologies) == 1.0
    routes = route_ranks(ranks, plans, topologies, FailedSet(links=frozenset({("a", "mlx5_0", 1)})))
    # GPU 0 moves to mlx5_1/1 (100G), shared with GPU 2: 50G against its 200G.
    assert bandwidth_left(routes, topologies) == 0.25


# -- connectivity against brute force, on both shapes --------------------------------------------
SHAPES = {"hgx4": hgx_node(rails=4), "dual": dual_port_node()}


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    shape=st.sampled_from(sorted(SHAPES)),
    nodes=st.integers(2, 4),
    dead_links=st.sets(st.tuples(st.integers(0, 3), st.integers(0, 7)), max_size=10),
    dead_cards=st.sets(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=3),
)
def test_connectivity_matches_brute_force(
    shape: str, nodes: int, dead_links: set[tuple[int, int]], dead_cards: set[tuple[int, int]]
) -> None:
    names = [f"n{i}" for i in range(nodes)]
    topologies = {n: topo(n, SHAPES[shape]) for n in names}
    plans = {n: plan_node(t) for n, t in topologies.items()}
    fabric = [r for r in topologies["n0"].rnics if r.carries_gpu_traffic]
    links = frozenset(
        (names[n], fabric[i % len(fabric)].name, fabric[i % len(fabric)].port)
        for n, i in dead_links
        if n < nodes
    )
    cards = frozenset((names[n], f"mlx5_{c}") for n, c in dead_cards if n < nodes)
    ranks = [(8 * i + g, n, g) for i, n in enumerate(names) for g in range(8)]
    routes = route_ranks(ranks, plans, topologies, FailedSet(rnics=cards, links=links))
    c = connectivity(routes, max_examples=5)
    fabric_pairs = [(a, b) for a, b in itertools.combinations(routes, 2) if talks_over_fabric(a, b)]
    broken = sorted((a.rank, b.rank) for a, b in fabric_pairs if not pair_survives(a, b))
    assert type(c.broken_pairs) is int and type(c.total_pairs) is int
    assert c.total_pairs == len(fabric_pairs)
    assert c.broken_pairs == len(broken)
    assert c.routes == tuple(routes)
    assert set(c.examples) <= set(broken)
    assert len(c.examples) == min(5, len(broken)) or len(c.examples) >= 1 or not broken
    assert c.isolated_ranks == tuple(r.rank for r in routes if not (r.primary_ok or r.backup_ok))
    assert c.failed_over_ranks == tuple(r.rank for r in routes if r.backup_ok and not r.primary_ok)
    assert [r.gpu for r in routes] == [g for _, _, g in ranks]


def test_examples_take_isolated_ranks_first_then_failed_over_ones() -> None:
    def route(rank: int, node: str, rail: int, primary_ok: bool, backup_ok: bool) -> RankRoute:
        return RankRoute(rank, node, rail, f"p{rail}", f"b{rail}", primary_ok, backup_ok, rail)

    routes = [
        route(0, "a", 0, False, False),  # no path left: cut off from ranks 2 and 4
        route(1, "a", 1, False, True),  # failed over ...
        route(2, "b", 0, True, True),
        route(3, "b", 1, True, False),  # ... while its peer lost its backup: (1, 3) is cut
        route(4, "c", 0, True, True),
        route(5, "c", 1, True, True),
    ]
    c = connectivity(routes, max_examples=3)
    assert c.broken_pairs == 3
    assert c.examples == ((0, 2), (0, 4), (1, 3))
    assert connectivity(routes, max_examples=2).examples == ((0, 2), (0, 4))


# -- planner details ------------------------------------------------------------------------------
def test_no_fabric_rnic_gives_every_gpu_an_empty_plan() -> None:
    node = NodeTopology("n", (Gpu(0, "g0"), Gpu(1, "g1"), Gpu(2, "g2")), (Rnic("s", 1),))
    plan = plan_node(node)
    assert [g.gpu for g in plan.gpus] == [0, 1, 2]
    assert all(g.primary is None and g.backup is None for g in plan.gpus)


def test_equal_primaries_are_taken_in_turn() -> None:
    gpus = tuple(Gpu(i, f"g{i}", 0, "sw0", "rc0") for i in range(4))
    rnics = tuple(
        Rnic(f"mlx5_{c}", 1, numa=0, pcie_switch="sw0", root_complex="rc0", switch=f"s{c}", rail=c)
        for c in range(2)
    )
    plan = plan_node(NodeTopology("n", gpus, rnics))
    assert [g.primary for g in plan.gpus] == ["mlx5_0/1", "mlx5_1/1", "mlx5_0/1", "mlx5_1/1"]


def test_backups_spread_over_the_ports_of_the_backup_card() -> None:
    # Four GPUs behind card 0's switch; card 1 (two ports) on another switch is every backup.
    gpus = tuple(Gpu(i, f"g{i}", 0, "sw0", "rc0") for i in range(4))
    rnics = (
        Rnic("mlx5_0", 1, numa=0, pcie_switch="sw0", root_complex="rc0", switch="s0", rail=0),
        Rnic("mlx5_1", 1, numa=0, pcie_switch="sw1", root_complex="rc0", switch="s1", rail=1),
        Rnic("mlx5_1", 2, numa=0, pcie_switch="sw1", root_complex="rc0", switch="s2", rail=2),
    )
    plan = plan_node(NodeTopology("n", gpus, rnics), backup_cap_per_switch=10)
    assert [g.backup for g in plan.gpus] == ["mlx5_1/1", "mlx5_1/2", "mlx5_1/1", "mlx5_1/2"]


def test_backups_spread_over_switches_by_their_load() -> None:
    gpus = tuple(Gpu(i, f"g{i}", 0, "sw0", "rc0") for i in range(4))
    rnics = (
        Rnic("mlx5_0", 1, numa=0, pcie_switch="sw0", root_complex="rc0", switch="s0", rail=0),
        Rnic("mlx5_1", 1, numa=0, pcie_switch="sw1", root_complex="rc0", switch="s1", rail=1),
        Rnic("mlx5_2", 1, numa=0, pcie_switch="sw2", root_complex="rc0", switch="s2", rail=2),
    )
    plan = plan_node(NodeTopology("n", gpus, rnics), backup_cap_per_switch=10)
    assert [g.backup for g in plan.gpus] == ["mlx5_1/1", "mlx5_2/1", "mlx5_1/1", "mlx5_2/1"]


def test_cap_with_every_fabric_rnic_behind_one_switch() -> None:
    gpus = tuple(Gpu(i, f"g{i}", 0, "sw0", "rc0") for i in range(4))
    rnics = tuple(
        Rnic(f"mlx5_{c}", 1, numa=0, pcie_switch="sw0", root_complex="rc0", switch=f"s{c}", rail=c)
        for c in range(2)
    )
    assert default_backup_cap(NodeTopology("n", gpus, rnics)) == 4


# -- bandwidth ------------------------------------------------------------------------------------
def test_bandwidth_when_nothing_routes_and_when_primaries_are_shared() -> None:
    assert bandwidth_left([], {}) == 1.0
    topologies = {"a": topo("a", hgx_node(rails=4))}  # two GPUs per RNIC
    plans = {"a": plan_node(topologies["a"])}
    ranks = [(g, "a", g) for g in range(8)]
    healthy = route_ranks(ranks, plans, topologies, FailedSet())
    assert bandwidth_left(healthy, topologies) == 1.0
    # Every RNIC dead: no rank routes, nothing to compare.
    dead = FailedSet(rnics=frozenset(("a", f"mlx5_{i}") for i in range(4)))
    assert bandwidth_left(route_ranks(ranks, plans, topologies, dead), topologies) == 1.0


def test_bandwidth_skips_isolated_ranks_and_looks_at_the_rest() -> None:
    topologies = {"a": topo("a", dual_port_node())}
    plans = {"a": plan_node(topologies["a"])}
    ranks = [(g, "a", g) for g in range(8)]
    # GPU 0 loses both paths (mlx5_0/1 and mlx5_1/1); GPU 1 fails over onto mlx5_1/2,
    # which it then shares with GPU 3: half its bandwidth.
    failed = FailedSet(
        links=frozenset({("a", "mlx5_0", 1), ("a", "mlx5_1", 1), ("a", "mlx5_0", 2)})
    )
    routes = route_ranks(ranks, plans, topologies, failed)
    assert routes[0].active is None
    assert bandwidth_left(routes, topologies) == 0.5


def test_unknown_primary_rate_counts_as_one_gbps() -> None:
    body = dual_port_node()
    for r in body["rnics"]:
        r["rate_gbps"] = 0.0 if r["name"] == "mlx5_0" else 0.5
    topologies = {"a": topo("a", body)}
    plans = {"a": plan_node(topologies["a"])}
    routes = route_ranks(
        [(0, "a", 0)], plans, topologies, FailedSet(links=frozenset({("a", "mlx5_0", 1)}))
    )
    # 0.5 Gb/s on the backup against the 1 Gb/s assumed for the unknown primary.
    assert bandwidth_left(routes, topologies) == 0.5


def test_a_switch_with_two_backup_cards_counts_both_cards_backups() -> None:
    gpus = tuple(Gpu(i, f"g{i}", 0, "sw0", "rc0") for i in range(4))
    rnics = (
        Rnic("mlx5_0", 1, numa=0, pcie_switch="sw0", root_complex="rc0", switch="s0", rail=0),
        Rnic("mlx5_1", 1, numa=0, pcie_switch="sw1", root_complex="rc0", switch="s1", rail=1),
        Rnic("mlx5_2", 1, numa=0, pcie_switch="sw1", root_complex="rc0", switch="s2", rail=2),
        Rnic("mlx5_3", 1, numa=0, pcie_switch="sw2", root_complex="rc0", switch="s3", rail=3),
    )
    plan = plan_node(NodeTopology("n", gpus, rnics), backup_cap_per_switch=10)
    # sw1 holds two backups after GPU 2, sw2 one: GPU 3 goes to sw2.
    assert [g.backup for g in plan.gpus] == ["mlx5_1/1", "mlx5_3/1", "mlx5_2/1", "mlx5_3/1"]
