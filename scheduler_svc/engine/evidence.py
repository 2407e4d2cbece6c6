"""Which evidence touches a job, and how a decision names it.

A fault, switch, quarantine or maintenance window concerns a job when it takes out a
port (or GPU, or node) some rank uses as primary or backup (`affects`; with the job's
index, from the ports it keeps). Beside that: what a restart decided now is for
(`known`), the port faults of a switch inferred failed counted as that one failure
(`one_failure`), and the words a decision's reason opens with (`fault_note`,
`node_failure_note`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set

from scheduler_svc.engine import coordination as coord
from scheduler_svc.engine.fabric import FaultKind, Unhealthy
from scheduler_svc.engine.jobindex import odd_routes
from scheduler_svc.engine.paths import NodeTopology
from scheduler_svc.engine.routes import Connectivity, JobIndex, RankRoute
from scheduler_svc.engine.state import FabricView, JobState


def job_nodes(job: JobState, conn: Connectivity) -> Set[str]:
    """The job's nodes (the index keeps them)."""
    if conn.index is not None:
        return conn.index.nodes
    return {n for _, n, _ in job.ranks}


def _uses(conn: Connectivity) -> set[tuple[str, str, int]]:
    used = set()
    for r in conn.routes:
        for key in (r.primary, r.backup):
            if key:
                dev, _, port = key.partition("/")
                used.add((r.node, dev, int(port)))
    return used


def affects(u: Unhealthy, conn: Connectivity, fabric: FabricView) -> bool:
    """Whether the evidence takes out a port (or GPU) that some rank uses as primary or backup."""
    index = conn.index
    if index is not None:
        return _affects_indexed(u, index)
    if u.kind == "switch" or (u.node is None and u.switch is not None):
        return any(
            r.node in fabric.topologies
            and key is not None
            and _switch_of(fabric.topologies[r.node], key) == u.switch
            for r in conn.routes
            for key in (r.primary, r.backup)
        )
    if u.kind == "gpu_lost":
        return any(r.node == u.node and r.gpu == u.port for r in conn.routes)
    if u.kind == "unreachable":
        return any(r.node == u.node for r in conn.routes)
    return any(node == u.node and _takes_port(u, dev, port) for node, dev, port in _uses(conn))


def _affects_indexed(u: Unhealthy, index: JobIndex) -> bool:
    """affects from the ports, switches and GPUs the index says the job uses."""
    if u.kind == "switch" or (u.node is None and u.switch is not None):
        return u.switch in index.used_switches
    if u.kind == "gpu_lost":
        return (u.node, u.port) in index.used_gpus
    if u.kind == "unreachable":
        return u.node in index.nodes
    return any(_takes_port(u, dev, port) for dev, port in index.ports_by_node.get(u.node or "", ()))


def _takes_port(u: Unhealthy, device: str, port: int) -> bool:
    """Whether evidence on the node takes this port (or its whole RNIC, or the node's)."""
    return u.device in (device, None) and u.port in (0, port, None)


def _switch_of(topo: NodeTopology, key: str) -> str | None:
    try:
        return topo.rnic(key).switch
    except KeyError:
        return None


def isolated_by(
    fabric: FabricView, conn: Connectivity, evidence: Sequence[Unhealthy], keys: Set[str]
) -> bool:
    """Whether some rank left without a path lost both its RNICs (or its GPU, or its node)
    to the evidence `keys`, which a restart was decided for: placed back there, the job
    has that rank without a path again, whatever else broke since, so restarting it once
    more on this placement cannot help."""
    if not conn.isolated_ranks or not keys:
        return False
    touched = [u for u in evidence if u.key in keys]
    isolated = set(conn.isolated_ranks)
    return any(_lost_to(fabric, r, touched) for r in odd_routes(conn) if r.rank in isolated)


def _lost_to(fabric: FabricView, r: RankRoute, evidence: Sequence[Unhealthy]) -> bool:
    """Whether `evidence` alone takes the rank's node, its GPU, or both of its RNICs."""
    topo = fabric.topologies.get(r.node)
    if topo is None:
        return False
    for u in evidence:
        if u.node == r.node and (
            u.kind == FaultKind.UNREACHABLE or (u.kind == FaultKind.GPU_LOST and u.port == r.gpu)
        ):
            return True
    for end in (r.primary, r.backup):
        if end is None:
            continue
        try:
            rnic = topo.rnic(end)
        except KeyError:
            return False
        if not any(
            (u.switch is not None and u.node is None and u.switch == rnic.switch)
            or (u.node == r.node and _takes_port(u, rnic.name, rnic.port))
            for u in evidence
        ):
            return False
    return True


def one_failure(restarted_for: frozenset[str], evidence: Sequence[Unhealthy]) -> frozenset[str]:
    """`restarted_for` with each switch inferred failed and its ports' faults as one: when
    the job was restarted for any of them, for all of them."""
    out = set(restarted_for)
    for sw in evidence:
        if sw.kind != "switch":
            continue
        one = {sw.key} | {u.key for u in evidence if u.node is not None and u.switch == sw.switch}
        if one & restarted_for:
            out |= one
    return frozenset(out)


def known(
    job: JobState, conn: Connectivity, fabric: FabricView, evidence: Iterable[Unhealthy]
) -> frozenset[str]:
    """What a restart decided now is for: the evidence, and the maintenance windows
    announced on the job's parts (the fleet manager knows of them when it places the next
    incarnation)."""
    nodes = job_nodes(job, conn)
    announced = [
        u
        for u in fabric.scheduled
        if (u.node is None or u.node in nodes) and affects(u, conn, fabric)
    ]
    return frozenset(u.key for u in (*evidence, *announced))


def evidence_for(conn: Connectivity, fabric: FabricView, nodes: Set[str]) -> list[Unhealthy]:
    return [
        u
        for u in fabric.unhealthy
        if (u.node is None or u.node in nodes) and affects(u, conn, fabric)
    ]


def fault_note(first: Unhealthy | None, evidence: Sequence[Unhealthy]) -> str | None:
    if first is None:
        return None
    if first.kind == "switch":
        return (
            f"switch {first.label} inferred failed ({first.reason}); all its links count as failed"
        )
    if first.kind in ("gpu_lost", "rnic_lost"):
        what = "GPU" if first.kind == "gpu_lost" else "RNIC"
        return f"{what} {first.label} is gone from the node's registration ({first.kind})"
    if first.kind == "quarantine":
        return f"port {first.label} is quarantined ({first.reason})"
    if first.kind == "unreachable":
        return first.reason
    if first.kind == "maintenance":
        return f"{first.label}: {first.reason}"
    return None


def node_failure_note(
    evidence: Sequence[Unhealthy], fabric: FabricView, nodes: Set[str]
) -> str | None:
    """A node whose every fabric port failed looks like a dead peer: say so in the reason."""
    dead = []
    for node in sorted({u.node for u in evidence if u.node} & nodes):
        fabric_ports = fabric.fabric_ports.get(node, frozenset())
        failed: set[tuple[str, int]] = set()
        for u in evidence:
            if u.node != node or u.device is None:
                continue
            if not u.port:
                failed |= {(d, p) for d, p in fabric_ports if d == u.device}
            else:
                failed.add((u.device, u.port))
        if coord.is_node_failure(failed, fabric_ports):
            dead.append(node)
    if not dead:
        return None
    return (
        f"node failure: every fabric RNIC of {', '.join(dead)} failed "
        "(a dead peer, not the network)"
    )
