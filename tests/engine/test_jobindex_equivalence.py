"""The incremental path decides exactly what the whole-job recomputation decides (issue 12).

Random topologies (RNICs with one or two ports, rails and switches shared or not,
PCIe locality that makes backups near or far, GPUs without NVLink, nodes the
service does not know), random placements and communicator layouts, and random
sets of failed RNICs, links, switches and GPUs. For each, two passes of the job's
life (a first set of faults, then a second one on the state the first left):
`reconcile` with the job's index and without it must return the same desired
state, decision, connectivity and warnings, and `command_diff` the same commands.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_svc.engine import jobindex
from scheduler_svc.engine.fabric import Unhealthy
from scheduler_svc.engine.intents import command_diff
from scheduler_svc.engine.job_routes import index_for, routes_of
from scheduler_svc.engine.mitigations import plan_mitigations
from scheduler_svc.engine.paths import FailedSet, Gpu, NodeTopology, Rnic, plan_node
from scheduler_svc.engine.reconcile import reconcile
from scheduler_svc.engine.routes import connectivity, route_ranks
from scheduler_svc.engine.state import CommSpec, FabricView, JobState, Mode, Options
from tests.engine.jobs import T0, a_job, rail_optimised

OPTIONS = Options()


@st.composite
def node_topology(draw: st.DrawFn, name: str) -> NodeTopology:
    if draw(st.booleans()):
        return rail_optimised(name, draw(st.integers(2, 4)))
    locality = st.tuples(st.sampled_from([0, 1]), st.sampled_from(["p0", "p1", "p2"]))
    gpus = []
    for i in range(draw(st.integers(1, 4))):
        numa, pcie = draw(locality)
        gpus.append(Gpu(i, f"g{i}", numa, pcie, f"rc-{pcie}", nvlink=draw(st.booleans())))
    rnics = []
    for i in range(draw(st.sampled_from([1, 2, 2, 3, 4, 4]))):
        numa, pcie = draw(locality)
        rail = draw(st.sampled_from([None, 0, 1, 2, 3, 0, 1, 2, 3]))
        shared = draw(st.booleans())  # one switch for every rail, or a leaf per rail
        switch = None if rail is None else ("spine" if shared else f"leaf{rail}")
        for port in range(1, draw(st.integers(1, 2)) + 1):
            rnics.append(
                Rnic(
                    f"mlx5_{i}",
                    port,
                    numa=numa,
                    pcie_switch=pcie,
                    root_complex=f"rc-{pcie}",
                    rate_gbps=draw(st.sampled_from([0.0, 200.0, 400.0])),
                    switch=switch,
                    rail=rail if port == 1 else draw(st.one_of(st.none(), st.integers(0, 3))),
                )
            )
    return NodeTopology(name, tuple(gpus), tuple(rnics))


@st.composite
def scenario(draw: st.DrawFn) -> tuple[JobState, dict[str, NodeTopology], list[FailedSet]]:
    names = [f"n{i}" for i in range(draw(st.integers(1, 5)))]
    topologies = {n: draw(node_topology(n)) for n in names}
    slots = [(n, g.index) for n in names for g in topologies[n].gpus]
    if draw(st.integers(0, 5)) == 0:
        slots.append(("ghost", 0))  # a node the service does not know
    chosen = draw(st.lists(st.sampled_from(slots), min_size=1, max_size=16, unique=True))
    numbers = draw(st.permutations(range(len(chosen))))
    ranks = tuple((r, n, g) for r, (n, g) in zip(numbers, chosen, strict=True))
    rank_ids = [r for r, _, _ in ranks]
    comms = tuple(
        CommSpec(
            100 + i,
            draw(st.integers(1, 8)),
            tuple(draw(st.lists(st.sampled_from(rank_ids), max_size=len(rank_ids)))),
        )
        for i in range(draw(st.integers(0, 3)))
    )
    job = a_job(
        ranks,
        communicators=comms,
        comm_share=draw(st.sampled_from([None, 0.3])),
        allow_scaling=draw(st.booleans()),
    )
    devices = [(n, r.name, r.port, r.switch) for n in names for r in topologies[n].rnics]
    gpus = [(n, g) for n, g in slots]
    switches = sorted({s for *_, s in devices if s is not None}) or ["none"]

    def rare() -> int:
        return int(draw(st.integers(0, 3)) == 0)

    def failed() -> FailedSet:
        some = st.lists(st.sampled_from(devices), max_size=draw(st.sampled_from([0, 1, 1, 2])))
        return FailedSet(
            rnics=frozenset(
                (n, "*" if draw(st.booleans()) and d == "mlx5_0" else d)
                for n, d, _, _ in draw(some)
            ),
            links=frozenset((n, d, p) for n, d, p, _ in draw(some)),
            switches=frozenset(draw(st.lists(st.sampled_from(switches), max_size=rare()))),
            gpus=frozenset(draw(st.lists(st.sampled_from(gpus), max_size=rare()))),
        )

    return job, topologies, [failed(), failed()]


def evidence(failed: FailedSet, at: datetime) -> tuple[Unhealthy, ...]:
    """One piece of evidence per failed part, as the fabric assessment names them."""
    out = [
        Unhealthy(
            f"fault:r{n}{d}", f"{n}/{d}", "rnic_fatal", at, "fatal", n, None if d == "*" else d, 0
        )
        for n, d in sorted(failed.rnics)
    ]
    out += [
        Unhealthy(f"fault:l{n}{d}{p}", f"{n}/{d}/{p}", "link_down", at, "down", n, d, p)
        for n, d, p in sorted(failed.links)
    ]
    out += [
        Unhealthy(f"switch:{s}", s, "switch", at, "inferred", switch=s)
        for s in sorted(failed.switches)
    ]
    out += [
        Unhealthy(f"fault:g{n}{g}", f"{n}/gpu{g}", "gpu_lost", at, "gone", n, None, g)
        for n, g in sorted(failed.gpus)
    ]
    return tuple(out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_the_index_decides_what_the_whole_job_decides(
    case: tuple[JobState, dict[str, NodeTopology], list[FailedSet]],
) -> None:
    job, topologies, faults = case
    plans = {n: plan_node(t) for n, t in topologies.items()}
    healthy = FabricView(topologies, plans, FailedSet())
    index = index_for(job, healthy)
    state = job
    commanded = job.previous
    # The first set again last: each node's routes kept from the first pass are given
    # again where its failures are those of the first pass (`JobIndex.routed`).
    for step, failed in enumerate([*faults, faults[0]]):
        now = T0 + timedelta(minutes=40 + step)
        fabric = FabricView(topologies, plans, failed, evidence(failed, now))

        whole = connectivity(route_ranks(job.ranks, plans, topologies, failed))
        part = routes_of(state, fabric, index)
        assert part.index is index  # the incremental path was taken
        assert part == whole
        assert part.odd == tuple(
            i for i, r in enumerate(whole.routes) if not (r.primary_ok and r.backup_ok)
        )
        assert plan_mitigations(state, fabric, part, OPTIONS) == plan_mitigations(
            state, fabric, whole, OPTIONS
        )

        slow = reconcile(now, state, fabric, OPTIONS)
        fast = reconcile(now, state, fabric, OPTIONS, index)
        assert fast == slow
        assert fast.conn.index is index  # reconcile took the incremental path too
        assert command_diff(commanded, fast.desired, state, index) == command_diff(
            commanded, slow.desired, state
        )
        commanded = slow.desired
        state = replace(state, previous=slow.desired, mode=slow.desired.mode)


def test_an_index_built_for_other_plans_is_not_used() -> None:
    topo = NodeTopology(
        "a",
        (Gpu(0, "g0", 0, "p0", "r0"),),
        (
            Rnic("mlx5_0", 1, numa=0, pcie_switch="p0", root_complex="r0", switch="s0", rail=0),
            Rnic("mlx5_1", 1, numa=0, pcie_switch="p0", root_complex="r0", switch="s1", rail=1),
        ),
    )
    job = JobState("j", Mode.NORMAL, ((0, "a", 0),), 3600.0, 600.0, 0.0, 30.0, T0)
    index = index_for(job, FabricView({"a": topo}, {"a": plan_node(topo)}, FailedSet()))
    other = NodeTopology("a", topo.gpus, tuple(reversed(topo.rnics)))
    moved = FabricView({"a": other}, {"a": plan_node(other, 2)}, FailedSet())
    assert routes_of(job, moved, index).index is None
    assert routes_of(replace(job, ranks=((1, "a", 0),)), moved, index).index is None
    assert jobindex.touched(index, FailedSet(links=frozenset({("a", "mlx5_1", 1)}))) == {0}


def test_a_nodes_routes_are_kept_while_what_fails_there_is_the_same() -> None:
    """Each node's routes are kept on the index with the failures that gave them, and
    given again while those are the same: its own failed parts and the failed switches
    its ports are cabled to. A switch failing under a node whose own parts did not change
    routes it again; so does a failure there going away."""
    topologies = {n: rail_optimised(n, 4) for n in ("a", "b")}
    plans = {n: plan_node(t) for n, t in topologies.items()}
    slots = [(n, g) for n in ("a", "b") for g in range(4)]
    job = a_job(tuple((rank, n, g) for rank, (n, g) in enumerate(slots)))
    index = index_for(job, FabricView(topologies, plans, FailedSet()))

    def check(failed: FailedSet) -> None:
        whole = connectivity(route_ranks(job.ranks, plans, topologies, failed))
        assert jobindex.connectivity(index, failed, plans, topologies) == whole

    on_a = FailedSet(links=frozenset({("a", "mlx5_0", 1)}))
    check(on_a)
    kept = index.routed["a"]
    assert kept[1] == (frozenset({("l", "mlx5_0", 1)}), frozenset())
    on_both = replace(on_a, links=on_a.links | {("b", "mlx5_1", 1)})
    check(on_both)
    assert index.routed["a"] is kept  # nothing changed on a: not routed again
    assert set(index.routed) == {"a", "b"}
    leaf = replace(on_both, switches=frozenset({"leaf2"}))  # mlx5_2 of each node
    check(leaf)
    assert index.routed["a"] is not kept
    assert index.routed["a"][1][1] == {"leaf2"}
    check(on_both)  # the leaf is back
    check(FailedSet(gpus=frozenset({("a", 0)}), rnics=frozenset({("b", "*")})))
    check(FailedSet(gpus=frozenset({("a", 1)}), rnics=frozenset({("b", "mlx5_1")})))
    check(on_a)
