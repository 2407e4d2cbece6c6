"""Which evidence touches a job: a port, a GPU, a node or a switch some rank uses."""

from __future__ import annotations

from datetime import UTC, datetime

from scheduler_svc.engine import jobindex
from scheduler_svc.engine.evidence import affects as engine_affects
from scheduler_svc.engine.fabric import SwitchEvidence, Unhealthy
from scheduler_svc.engine.paths import FailedSet, Gpu, NodeTopology, Rnic, plan_node
from scheduler_svc.engine.routes import Connectivity, RankRoute, connectivity, route_ranks
from scheduler_svc.engine.state import FabricView
from tests.engine.stories import Story, at, down

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def topo(name: str) -> NodeTopology:
    gpus = (Gpu(0, "g0", pcie_switch="p0"), Gpu(1, "g1", pcie_switch="p1"))
    rnics = (
        Rnic("mlx5_0", 1, pcie_switch="p0", switch="s0", rail=0),
        Rnic("mlx5_1", 1, pcie_switch="p1", switch="s1", rail=1),
    )
    return NodeTopology(name, gpus, rnics)


TOPOS = {"n1": topo("n1"), "n2": topo("n2")}
FABRIC = FabricView(TOPOS, {n: plan_node(t) for n, t in TOPOS.items()}, FailedSet())


def conn(*routes: RankRoute) -> Connectivity:
    return Connectivity(tuple(routes), 0, 0, (), (), ())


def r(rank: int, node: str, gpu: int, primary: str | None, backup: str | None) -> RankRoute:
    return RankRoute(rank, node, gpu, primary, backup, True, True)


def ev(kind: str, **kw: object) -> Unhealthy:
    return Unhealthy("k", "label", kind, T0, "why", **kw)  # type: ignore[arg-type]


# n1: GPU 0 on mlx5_0/1 (backup mlx5_1/1); n2: GPU 1 on mlx5_1/1 only.
ROUTES = conn(r(0, "n1", 0, "mlx5_0/1", "mlx5_1/1"), r(1, "n2", 1, "mlx5_1/1", None))


def test_switch_evidence_counts_ranks_behind_that_switch() -> None:
    switch = ev("switch", switch="s1")
    assert engine_affects(switch, ROUTES, FABRIC)
    # Only n2's rank, on its primary, is behind s1.
    assert engine_affects(switch, conn(r(1, "n2", 1, "mlx5_1/1", None)), FABRIC)
    # n1's rank uses s0 only: a backup-less route on s0.
    assert not engine_affects(switch, conn(r(0, "n1", 0, "mlx5_0/1", None)), FABRIC)
    # A rank with no path, or on a node whose topology is unknown, is behind no switch.
    assert not engine_affects(switch, conn(r(0, "n1", 0, None, None)), FABRIC)
    assert not engine_affects(switch, conn(r(5, "n9", 0, "mlx5_1/1", None)), FABRIC)
    # A port the topology does not have is on no switch.
    assert not engine_affects(switch, conn(r(0, "n1", 0, "mlx5_7/1", None)), FABRIC)


def test_switch_wide_maintenance_is_judged_by_its_switch() -> None:
    window = ev("maintenance", switch="s1")
    assert engine_affects(window, ROUTES, FABRIC)
    assert not engine_affects(window, conn(r(0, "n1", 0, "mlx5_0/1", None)), FABRIC)


def test_switch_kind_decides_by_switch_even_with_a_node() -> None:
    switch = ev("switch", node="n1", switch="s1")
    # No rank on n1, yet n2's rank is behind s1.
    assert engine_affects(switch, conn(r(1, "n2", 1, "mlx5_1/1", None)), FABRIC)


def test_a_link_fault_on_a_switch_port_is_judged_by_its_port() -> None:
    """A fault names its port's switch, but only that port of that node is out."""
    link = ev("link_down", node="n1", device="mlx5_1", port=1, switch="s1")
    assert not engine_affects(link, conn(r(1, "n2", 1, "mlx5_1/1", None)), FABRIC)
    assert engine_affects(link, ROUTES, FABRIC)  # n1's backup


def test_gpu_lost_needs_that_gpu_on_that_node() -> None:
    assert engine_affects(ev("gpu_lost", node="n2", port=1), ROUTES, FABRIC)
    assert engine_affects(ev("gpu_lost", node="n1", port=0), ROUTES, FABRIC)
    assert not engine_affects(ev("gpu_lost", node="n1", port=1), ROUTES, FABRIC)
    assert not engine_affects(ev("gpu_lost", node="n3", port=0), ROUTES, FABRIC)


def test_unreachable_takes_every_rank_of_the_node_even_without_a_path() -> None:
    pathless = conn(r(0, "n1", 0, None, None))
    unreachable = ev("unreachable", node="n1", device="", port=0)
    assert engine_affects(unreachable, pathless, FABRIC)
    assert engine_affects(unreachable, ROUTES, FABRIC)
    assert not engine_affects(ev("unreachable", node="n3", device="", port=0), ROUTES, FABRIC)


def test_link_evidence_needs_node_device_and_port_to_match() -> None:
    routes = conn(r(0, "n1", 0, "mlx5_0/1", None), r(1, "n2", 1, "mlx5_1/1", None))
    assert engine_affects(ev("link_down", node="n1", device="mlx5_0", port=1), routes, FABRIC)
    # The whole RNIC (port 0), the whole node (no device, no port).
    assert engine_affects(ev("rnic_fatal", node="n1", device="mlx5_0", port=0), routes, FABRIC)
    assert engine_affects(ev("maintenance", node="n1", port=0), routes, FABRIC)
    # Another device, another port, another node: untouched.
    assert not engine_affects(ev("link_down", node="n1", device="mlx5_1", port=1), routes, FABRIC)
    assert not engine_affects(ev("link_down", node="n1", device="mlx5_0", port=2), routes, FABRIC)
    assert not engine_affects(ev("link_down", node="n3", device="mlx5_0", port=1), routes, FABRIC)
    assert not engine_affects(ev("quarantine", node="n2", device="mlx5_0", port=1), routes, FABRIC)
    assert not engine_affects(ev("link_down", node="n1", device="mlx5_0", port=1), conn(), FABRIC)


def test_evidence_on_the_jobs_nodes_that_no_rank_uses_is_not_the_jobs() -> None:
    """A port on one of the job's nodes that no rank uses (as primary or backup), and a
    switch no rank is behind, are no evidence of the job's: reconcile neither decides on
    them nor accounts for them, and a later fault it uses is the only one its decision
    names."""
    s = Story(["n0", "n1"], ranks=((0, "n0", 0), (1, "n1", 0)))  # mlx5_0, backup mlx5_1
    s.faults[1] = down(1, "n0", "mlx5_5", 3000)
    s.switches[2] = SwitchEvidence(2, "rail5-leaf", at(3000), "2 nodes lost their port")
    out = s.step(3000)
    assert out.decision is None
    assert out.desired.evidence == frozenset()
    s.faults[3] = down(3, "n0", "mlx5_0", 3100)
    out = s.step(3100)
    assert out.desired.evidence == frozenset({"fault:3"})
    assert out.desired.moved == {0: "mlx5_1/1"}
    assert out.decision is not None
    assert [c["evidence"] for c in out.decision.plan["failed_components"]] == ["fault:3"]


# --- the same questions answered from a job's index -----------------------------------------

# As placed on FABRIC: n1's GPU 0 on mlx5_0/1 (s0) backed up by mlx5_1/1 (s1), and n2's
# GPU 1 on mlx5_1/1 (s1) backed up by mlx5_0/1 (s0); a rank on a node the service does
# not know has no path at all.
BOTH_NODES = ((0, "n1", 0), (1, "n2", 1))
N2_ONLY = ((1, "n2", 1),)
WITH_GHOST = ((0, "n1", 0), (7, "ghost", 0))


def affects(u: Unhealthy, ranks: tuple[tuple[int, str, int], ...], fabric: FabricView) -> bool:
    """`affects` for a job on `ranks`, from its routes and from its index: they must agree."""
    plans, topos = fabric.plans, fabric.topologies
    whole = connectivity(route_ranks(ranks, plans, topos, FailedSet()))
    index = jobindex.build(ranks, plans, topos)
    part = jobindex.connectivity(index, FailedSet(), plans, topos)
    assert whole.index is None and part.index is index
    answer = engine_affects(u, whole, fabric)
    assert engine_affects(u, part, fabric) == answer, (u, ranks)
    return answer


def test_indexed_switch_evidence_is_judged_by_the_switches_the_ranks_use() -> None:
    """A switch (inferred failed, or under switch-wide maintenance) touches the job when
    some rank's primary or backup is behind it, whether or not it also names a node."""
    assert affects(ev("switch", switch="s1"), N2_ONLY, FABRIC)
    assert not affects(ev("switch", switch="s9"), BOTH_NODES, FABRIC)
    # Named with a node the job is not on, the switch still counts; named with a node it
    # is on, only the switch does (n1's ports are not behind s9).
    assert affects(ev("switch", node="n1", switch="s0"), N2_ONLY, FABRIC)
    assert not affects(ev("switch", node="n1", switch="s9"), BOTH_NODES, FABRIC)
    assert affects(ev("maintenance", switch="s0"), N2_ONLY, FABRIC)
    assert not affects(ev("maintenance", switch="s9"), BOTH_NODES, FABRIC)


def test_indexed_port_evidence_on_a_switch_port_is_judged_by_its_port() -> None:
    """A link fault names its port's switch, but takes out that port of that node only."""
    assert not affects(ev("link_down", node="n1", device="mlx5_1", port=1, switch="s1"),
                       N2_ONLY, FABRIC)  # fmt: skip
    assert affects(ev("link_down", node="n2", device="mlx5_1", port=1, switch="s1"),
                   N2_ONLY, FABRIC)  # fmt: skip
    assert not affects(ev("link_down", node="n2", device="mlx5_1", port=2, switch="s1"),
                       N2_ONLY, FABRIC)  # fmt: skip


def test_indexed_unreachable_node_takes_every_rank_there_even_without_a_path() -> None:
    """An unreachable node touches the job iff one of its ranks is there."""
    assert affects(ev("unreachable", node="n1", device="", port=0), BOTH_NODES, FABRIC)
    assert affects(ev("unreachable", node="ghost", device="", port=0), WITH_GHOST, FABRIC)
    assert not affects(ev("unreachable", node="n2", device="", port=0), WITH_GHOST, FABRIC)


def test_indexed_port_and_gpu_evidence_needs_a_port_or_gpu_the_job_uses() -> None:
    """Port evidence counts on a node where some rank uses that device and port; a node
    the job is not on, or where its ranks have no path, has none."""
    assert affects(ev("link_down", node="n1", device="mlx5_1", port=1), BOTH_NODES, FABRIC)
    assert affects(ev("rnic_fatal", node="n2", device="mlx5_0", port=0), BOTH_NODES, FABRIC)
    assert affects(ev("maintenance", node="n1"), WITH_GHOST, FABRIC)
    assert not affects(ev("link_down", node="n1", device="mlx5_0", port=2), BOTH_NODES, FABRIC)
    assert not affects(ev("link_down", node="n3", device="mlx5_0", port=1), BOTH_NODES, FABRIC)
    assert not affects(ev("maintenance", node="ghost"), WITH_GHOST, FABRIC)
    assert affects(ev("gpu_lost", node="n2", port=1), BOTH_NODES, FABRIC)
    assert not affects(ev("gpu_lost", node="n2", port=0), BOTH_NODES, FABRIC)


def test_evidence_naming_no_node_and_no_switch_touches_no_job() -> None:
    """Evidence without a node or a switch takes out no port, whatever the nodes are named."""
    for name in ("n1", "XXXX", "node-0"):
        topos = {name: topo(name)}
        fabric = FabricView(topos, {name: plan_node(topos[name])}, FailedSet())
        ranks = ((0, name, 0), (1, name, 1))
        for kind in ("maintenance", "link_down", "rnic_fatal", "quarantine"):
            assert not affects(ev(kind), ranks, fabric)
            assert not affects(ev(kind, port=0), ranks, fabric)
