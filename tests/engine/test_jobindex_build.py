"""jobindex: what `build` keeps of a placement, and the checks that say whether a kept
index still fits the job and its nodes' plans.

The equivalence property test compares whole decisions; these pin down the index's
own fields and checks, which a decision reads only in some cases (a checkpoint
request reads `sorted_ranks`, the service reads `rank_node`), on two rail-optimised
nodes with ranks placed out of rank order.
"""

from __future__ import annotations

import random
import threading
from dataclasses import replace

import pytest

from scheduler_svc.engine import jobindex
from scheduler_svc.engine.paths import (
    FailedSet,
    Gpu,
    GpuPaths,
    NodePlan,
    NodeTopology,
    Rnic,
    plan_node,
)
from scheduler_svc.engine.routes import (
    JobIndex,
    Once,
    RankRoute,
    connectivity,
    pair_survives,
    route_ranks,
    talks_over_fabric,
)
from scheduler_svc.engine.state import CommSpec
from tests.engine.jobs import rail_optimised

TOPOS = {n: rail_optimised(n, 4) for n in ("a", "b")}
PLANS = {n: plan_node(t) for n, t in TOPOS.items()}
# GPU 0 has mlx5_0 (leaf0) with mlx5_1 (leaf1) as backup; GPU 2 mlx5_2 (leaf2) and mlx5_3.
RANKS = ((3, "b", 2), (0, "a", 0), (2, "b", 0), (1, "a", 2))
COMM = CommSpec(7, 4, (0, 1, 2, 3))


def build() -> JobIndex:
    return jobindex.build(RANKS, PLANS, TOPOS, [COMM])


def test_build_keeps_the_placement_by_node_rank_device_switch_and_gpu() -> None:
    index = build()
    # Positions are places in RANKS: rank 3 at 0, rank 0 at 1, rank 2 at 2, rank 1 at 3.
    assert index.positions == {3: 0, 0: 1, 2: 2, 1: 3}
    assert index.rank_node == {3: "b", 0: "a", 2: "b", 1: "a"}
    assert index.ranks_in_order == (3, 0, 2, 1)
    assert index.sorted_ranks == (0, 1, 2, 3)
    assert index.by_node == {"b": (0, 2), "a": (1, 3)}
    assert index.by_gpu == {("b", 2): (0,), ("a", 0): (1,), ("b", 0): (2,), ("a", 2): (3,)}
    assert index.by_device == {
        ("b", "mlx5_2"): (0,),
        ("b", "mlx5_3"): (0,),
        ("a", "mlx5_0"): (1,),
        ("a", "mlx5_1"): (1,),
        ("b", "mlx5_0"): (2,),
        ("b", "mlx5_1"): (2,),
        ("a", "mlx5_2"): (3,),
        ("a", "mlx5_3"): (3,),
    }
    assert index.by_switch == {"leaf2": (0, 3), "leaf3": (0, 3), "leaf0": (1, 2), "leaf1": (1, 2)}
    assert index.used_switches == {"leaf0", "leaf1", "leaf2", "leaf3"}
    assert index.by_rail == {2: (0, 3), 0: (1, 2)}
    ports = {("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 1), ("mlx5_3", 1)}
    assert index.ports_by_node == {"a": ports, "b": ports}
    assert index.odd == ()  # every rank has both endpoints on the healthy fabric


def test_a_communicator_is_indexed_with_its_id_and_whether_a_member_repeats() -> None:
    (once,) = build().comms
    assert (once.comm_id, once.ranks, once.unique, once.nodes) == (7, (0, 1, 2, 3), True, 2)
    twice = jobindex.build(RANKS, PLANS, TOPOS, [CommSpec(8, 4, (0, 1, 1, 2))]).comms[0]
    assert (twice.comm_id, twice.ranks, twice.unique) == (8, (0, 1, 1, 2), False)
    assert twice.order == {0: 0, 1: 1, 2: 3}  # a repeated member keeps its first place


def test_a_rank_placed_twice_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^a rank is placed twice$"):
        jobindex.build(((0, "a", 0), (0, "b", 0)), PLANS, TOPOS)


def test_groups_list_each_keys_positions_in_ascending_order() -> None:
    # Many ranks on few nodes: an unstable sort would hand a node's positions back shuffled.
    rng = random.Random(20261202)
    keys = [f"n{rng.randrange(7)}" for _ in range(20_000)]
    ranks = tuple((i, node, 0) for i, node in enumerate(keys))
    groups = jobindex.build(ranks, {}, {}).by_node  # nodes without a plan: no paths, still indexed
    assert groups == {k: tuple(i for i, x in enumerate(keys) if x == k) for k in set(keys)}


def test_an_index_fits_equal_ranks_and_communicators_only() -> None:
    index = build()
    assert index.fits(index.ranks, [COMM])
    assert index.fits(list(index.ranks), [COMM])  # an equal copy fits too
    assert not index.fits(RANKS[:3], [COMM])
    assert not index.fits(((3, "b", 2), (0, "a", 0), (2, "b", 0), (1, "a", 0)), [COMM])
    assert not index.fits(index.ranks, [CommSpec(7, 8, (0, 1, 2, 3))])
    assert not index.fits(index.ranks, [])


def test_an_index_is_built_on_equal_plans_and_topologies_only() -> None:
    index = build()
    assert index.built_on(PLANS, TOPOS)
    # Other mappings holding equal (not the same) plans, as the plan cache may give.
    fresh = {n: plan_node(t) for n, t in TOPOS.items()}
    assert fresh["a"] is not PLANS["a"]
    assert index.built_on(fresh, dict(TOPOS))
    # The same plans, but node a cabled to other switches: not the fabric it was built on.
    a = TOPOS["a"]
    recabled = NodeTopology("a", a.gpus, tuple(replace(r, switch="spare") for r in a.rnics))
    assert not index.built_on(PLANS, {**TOPOS, "a": recabled})
    assert not index.built_on({**PLANS, "b": plan_node(recabled)}, TOPOS)


def test_route_of_finds_a_rank_with_or_without_an_index() -> None:
    index = build()
    whole = connectivity(route_ranks(RANKS, PLANS, TOPOS, FailedSet()))
    indexed = jobindex.connectivity(index, FailedSet(), PLANS, TOPOS)
    for conn in (whole, indexed):
        route = jobindex.route_of(conn, 2)
        assert route is not None and (route.rank, route.node, route.gpu) == (2, "b", 0)
        assert jobindex.route_of(conn, 9) is None


def test_a_pass_on_the_healthy_fabric_leaves_the_lookups_unmade() -> None:
    """What only a fault reads is made on its first read: not by the build, nor by a
    connectivity with nothing failed, nor by a failure that changes no rank's route."""
    index = build()
    assert not index.lookups.made
    healthy = jobindex.connectivity(index, FailedSet(), PLANS, TOPOS)
    assert healthy.broken_pairs == 0 and not index.lookups.made
    # A switch no rank uses: the lookups are read (to find whom it touches), nothing changes.
    elsewhere = jobindex.connectivity(index, FailedSet(switches=frozenset({"spine"})), PLANS, TOPOS)
    assert index.lookups.made
    assert elsewhere.routes == healthy.routes
    # Made once: another read gets the very same tables.
    by_device = index.by_device
    jobindex.connectivity(index, FailedSet(rnics=frozenset({("a", "mlx5_0")})), PLANS, TOPOS)
    assert index.by_device is by_device


def test_warm_makes_the_lookups_a_fault_would() -> None:
    warmed, cold = build(), build()
    warmed.warm()
    assert warmed.lookups.made and not cold.lookups.made
    failed = FailedSet(rnics=frozenset({("b", "mlx5_2")}))
    assert jobindex.connectivity(warmed, failed, PLANS, TOPOS) == jobindex.connectivity(
        cold, failed, PLANS, TOPOS
    )
    assert warmed.by_switch == cold.by_switch and warmed.node_counts == cold.node_counts


def test_once_makes_its_value_once_across_threads() -> None:
    entered, release = threading.Event(), threading.Event()
    made: list[int] = []

    def make() -> list[int]:
        entered.set()
        assert release.wait(10)
        made.append(1)
        return made

    once = Once(make)
    got: list[object] = []
    first = threading.Thread(target=lambda: got.append(once.get()))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=lambda: got.append(once.get()))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert made == [1] and got == [made, made] and once.made


# --- a hand-made plan: what plan_node rarely gives, the index must still count right ------

# Node "h": GPU 0's primary and backup are the two ports of one RNIC behind one switch;
# GPU 1's backup is that RNIC's second port, behind another switch; GPU 2's primary has
# no switch and no backup; GPU 3 has only a backup. Node "ghost" has no plan at all.
_H = NodeTopology(
    "h",
    tuple(Gpu(i, f"g{i}") for i in range(4)),
    (
        Rnic("mlx5_0", 1, "", switch="tor", rail=0),
        Rnic("mlx5_0", 2, "", switch="tor", rail=0),
        Rnic("mlx5_1", 1, "", switch="leaf1", rail=1),
        Rnic("mlx5_2", 1, "", switch=None, rail=2),
    ),
)
_H_PLAN = NodePlan(
    "h",
    (
        GpuPaths(0, "mlx5_0/1", "mlx5_0/2", 1, 1, "tor", "tor"),
        GpuPaths(1, "mlx5_1/1", "mlx5_0/2", 1, 2, "leaf1", "tor"),
        GpuPaths(2, "mlx5_2/1", None, 1, None, None, None),
        GpuPaths(3, None, "mlx5_1/1", None, 2, None, "leaf1"),
    ),
    backup_cap_per_switch=4,
)
# Rank 5 shares GPU 0 with rank 0; rank 4 is on a node the service does not know.
_H_RANKS = ((0, "h", 0), (1, "h", 1), (2, "h", 2), (3, "h", 3), (4, "ghost", 0), (5, "h", 0))


def test_lookups_count_a_ranks_device_and_switch_once_and_skip_what_it_lacks() -> None:
    everyone = CommSpec(9, 2, ())
    index = jobindex.build(_H_RANKS, {"h": _H_PLAN}, {"h": _H}, [everyone])
    assert index.by_device == {
        ("h", "mlx5_0"): (0, 1, 5),  # GPU 0's two ports count once; GPU 1's backup
        ("h", "mlx5_1"): (1, 3),
        ("h", "mlx5_2"): (2,),
    }
    assert index.by_switch == {"tor": (0, 1, 5), "leaf1": (1, 3)}  # no key for "no switch"
    assert index.used_switches == {"tor", "leaf1"}
    assert index.ports_by_node == {
        "h": {("mlx5_0", 1), ("mlx5_0", 2), ("mlx5_1", 1), ("mlx5_2", 1)}
    }
    assert index.by_gpu == {
        ("h", 0): (0, 5),
        ("h", 1): (1,),
        ("h", 2): (2,),
        ("h", 3): (3,),
        ("ghost", 0): (4,),
    }
    assert index.used_gpus == {("h", 0), ("h", 1), ("h", 2), ("h", 3), ("ghost", 0)}
    # (rail, node): class counts both / primary only / backup only / neither.
    assert index.node_counts == {
        (0, "h"): (2, 0, 0, 0),
        (1, "h"): (1, 0, 0, 0),
        (2, "h"): (0, 1, 0, 0),
        (None, "h"): (0, 0, 1, 0),  # GPU 3: no primary, so no rail
        (None, "ghost"): (0, 0, 0, 1),
    }
    assert index.odd == (2, 3, 4)
    (comm,) = index.comms  # a communicator naming no ranks: every rank of the job, once
    assert (comm.comm_id, comm.ranks, comm.unique, comm.nodes) == (9, (0, 1, 2, 3, 4, 5), True, 2)
    assert comm.order == {r: r for r in range(6)}
    assert comm.told == frozenset(range(6)) and comm.told_sorted == tuple(range(6))


def _brute_force(routes: tuple[RankRoute, ...]) -> tuple[int, int]:
    """(broken, total) fabric pairs, pair by pair."""
    pairs = [(a, b) for i, a in enumerate(routes) for b in routes[i + 1 :]]
    talking = [(a, b) for a, b in pairs if talks_over_fabric(a, b)]
    return sum(not pair_survives(a, b) for a, b in talking), len(talking)


@pytest.mark.parametrize("seed", range(6))
def test_pairs_counted_by_class_match_pairs_counted_one_by_one(seed: int) -> None:
    """Random routes in every endpoint class on a few rails and nodes: `connectivity`
    counts what a walk over every pair counts, and so does the index after a failure."""
    rng = random.Random(seed)
    routes = tuple(
        RankRoute(
            i,
            f"n{rng.randrange(4)}",
            0,
            "p",
            "b",
            rng.random() < 0.6,
            rng.random() < 0.7,
            rng.choice([0, 1, None]),
        )
        for i in range(60)
    )
    whole = connectivity(routes)
    assert (whole.broken_pairs, whole.total_pairs) == _brute_force(routes)
    assert whole.broken_pairs > 0  # the check can fail
    assert type(whole.broken_pairs) is int and type(whole.total_pairs) is int  # not 45.0
    index = jobindex.build(_H_RANKS, {"h": _H_PLAN}, {"h": _H})
    for failed in (
        FailedSet(switches=frozenset({"tor"})),
        FailedSet(rnics=frozenset({("h", "mlx5_1")})),
        FailedSet(links=frozenset({("h", "mlx5_0", 2)}), gpus=frozenset({("h", 2)})),
    ):
        conn = jobindex.connectivity(index, failed, {"h": _H_PLAN}, {"h": _H})
        assert (conn.broken_pairs, conn.total_pairs) == _brute_force(conn.routes), failed
        assert type(conn.broken_pairs) is int and type(conn.total_pairs) is int


def test_an_empty_placement_builds_an_empty_index() -> None:
    index = jobindex.build((), PLANS, TOPOS, [CommSpec(1, 1, ())])
    assert (index.broken_rail, index.total_rail, index.broken_local, index.total_local) == (
        0,
        0,
        0,
        0,
    )
    assert index.by_node == {} and index.node_counts == {} and index.by_switch == {}
    assert index.comms[0].ranks == () and index.comms[0].nodes == 0
