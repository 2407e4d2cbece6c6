"""Per communicator with a rank off its primary: which mitigation, and its channel plan.

`plan_mitigations` asks the coordination model (`coordination.plan_mitigation`) for
each communicator's predicted k under s-Bond, DCR, R²CCL balance and NVL transit,
and turns the chosen one into a plan: the channels that stay disabled, the channel
weights and allreduce split of balance (`channel_weights`), the transit GPU of each
rank sent over NVLink (`transit_gpus`). `with_mitigations` writes those plans into
the desired state; `describe` is how a decision shows them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler_svc.engine import coordination as coord
from scheduler_svc.engine.jobindex import odd_routes
from scheduler_svc.engine.routes import CommIndex, Connectivity, JobIndex, RankRoute
from scheduler_svc.engine.state import (
    IMPLICIT_COMM,
    NO_PLAN,
    CommSpec,
    Desired,
    FabricView,
    JobState,
    Mode,
    Options,
    comms_of,
)


@dataclass(frozen=True, slots=True)
class CommPlan:
    comm_id: int
    ranks: tuple[int, ...]
    plan: coord.MitigationPlan
    disabled_channels: tuple[int, ...]
    # R²CCL balance: each channel's share of the traffic, and the allreduce hand-off.
    weights: tuple[float, ...] = ()
    split_ratio: float = 0.0
    # NVL: rank -> node-local transit GPU, for each rank off its primary.
    transit: Mapping[int, int] = field(default_factory=dict)


def channel_weights(
    channel_rnics: Sequence[str | None], shares: Mapping[str, float] | None = None
) -> tuple[float, ...]:
    """R²CCL-Balance per channel: every RNIC still carrying traffic gets an equal share,
    a degraded one that share scaled by the bandwidth it has left (`shares`, RNIC -> 0..1).

    Channel c leaves the node through ``channel_rnics[c]`` (None: nowhere). An RNIC's
    share is split evenly among its channels, so a backup RNIC that also carries a
    failed rail's channels gives each of them less, and the node's traffic is in
    proportion to the bandwidth left. What a degraded RNIC gives up goes to the RNICs at
    full bandwidth, evenly (all degraded: each in proportion to what it has left).
    """
    per_rnic = Counter(k for k in channel_rnics if k is not None)
    if not per_rnic:
        return ()
    left = {k: min(1.0, max(0.0, x)) for k, x in (shares or {}).items() if k in per_rnic}
    if all(x >= 1.0 for x in left.values()):
        return tuple(
            0.0 if k is None else 1.0 / (len(per_rnic) * per_rnic[k]) for k in channel_rnics
        )
    share = {k: left.get(k, 1.0) / len(per_rnic) for k in per_rnic}
    full = [k for k in per_rnic if left.get(k, 1.0) >= 1.0]
    freed = 1.0 - sum(share.values())
    if full:
        for k in full:
            share[k] += freed / len(full)
    else:
        total = sum(share.values())
        if total <= 0:
            return ()
        share = {k: w / total for k, w in share.items()}
    return tuple(0.0 if k is None else share[k] / per_rnic[k] for k in channel_rnics)


def rnic_shares(fabric: FabricView, node: str, rnics: Iterable[str | None]) -> dict[str, float]:
    """The bandwidth each of `rnics` ("device/port") of `node` has left, where degraded."""
    out: dict[str, float] = {}
    for key in rnics:
        if key is None:
            continue
        dev, _, port = key.partition("/")
        found = [
            d.share
            for d in (
                fabric.degraded.get((node, dev, int(port or 0))),
                fabric.degraded.get((node, dev, 0)),
            )
            if d is not None
        ]
        if found:
            out[key] = min(found)
    return out


def transit_gpus(
    moved: Sequence[RankRoute], fabric: FabricView
) -> tuple[dict[int, int], int] | None:
    """NVL: each moved rank's transit GPU, and the most ranks sharing one GPU.

    A rank sends over NVLink to the GPU whose primary RNIC is the rank's backup (the
    peer GPU beside that RNIC), when that GPU has NVLink and works. None when some
    moved rank has no such peer: NVL cannot carry the whole communicator.
    """
    out: dict[int, int] = {}
    for r in moved:
        topo = fabric.topologies[r.node]
        nvlink = {g.index for g in topo.gpus if g.nvlink}
        if r.gpu not in nvlink:
            return None
        peers = [
            g.gpu
            for g in fabric.plans[r.node].gpus
            if g.primary == r.backup
            and g.gpu != r.gpu
            and g.gpu in nvlink
            and (r.node, g.gpu) not in fabric.failed.gpus
        ]
        if not peers:
            return None
        out[r.rank] = min(peers)
    by_gpu = Counter((r.node, out[r.rank]) for r in moved)
    return out, max(by_gpu.values(), default=0)


def plan_mitigations(
    job: JobState, fabric: FabricView, conn: Connectivity, options: Options
) -> list[CommPlan]:
    """Per communicator with a rank off its primary: predicted k under each mitigation."""
    plans = []
    comms = comms_of(job)
    index = conn.index
    if index is not None and len(index.comms) != len(comms):
        index = None
    by_rank: dict[int, RankRoute] = {}
    for k, comm in enumerate(comms):
        if index is not None and index.comms[k].unique and index.comms[k].comm_id == comm.comm_id:
            seen = _members_indexed(conn, index, index.comms[k])
        else:
            by_rank = by_rank or {r.rank: r for r in conn.routes}
            seen = _members(comm, by_rank)
        if seen is None:
            continue
        plans.append(_comm_plan(job, fabric, options, comm, seen))
    return plans


def _comm_plan(
    job: JobState, fabric: FabricView, options: Options, comm: CommSpec, seen: _Members
) -> CommPlan:
    """The mitigation chosen for one communicator, and its channel plan."""
    ranks, failed_by_node, worst, at_worst, _, _ = seen
    rails = sorted({r.rail for r in at_worst}, key=lambda x: (x is None, x))
    plan, transit = _predicted(job, fabric, options, comm, seen=seen, rails=rails)
    failed_rails = {rail for rails_ in failed_by_node.values() for rail in rails_}
    # Channel c leaves each node through rail index c mod (rails used): the
    # channels of a failed rail are the ones DCR disables.
    disabled = (
        [c for c in range(comm.channels) if rails[c % len(rails)] in failed_rails]
        if plan.chosen.mitigation in (coord.Mitigation.DCR, coord.Mitigation.BALANCE)
        else []
    )
    if len(disabled) >= comm.channels:
        disabled = []
    chosen = plan.chosen.mitigation
    weights: tuple[float, ...] = ()
    split = 0.0
    no_balance = {} if job.mode == Mode.RESTARTING else job.previous.no_balance
    if chosen == coord.Mitigation.BALANCE and comm.comm_id not in no_balance:
        # Where each rail of the worst node sends now: its primary, or its backup.
        out_of = {r.rail: r.active for r in at_worst}
        through = [out_of.get(rails[c % len(rails)]) for c in range(comm.channels)]
        weights = channel_weights(through, rnic_shares(fabric, worst, through))
        split = float(plan.chosen.detail.get("allreduce_handoff", 0.0))  # type: ignore[arg-type]  # a float in the detail
    return CommPlan(
        comm.comm_id,
        ranks,
        plan,
        tuple(disabled),
        weights=weights,
        split_ratio=split,
        transit=transit[0] if transit and chosen == coord.Mitigation.NVL else {},
    )


def _predicted(
    job: JobState,
    fabric: FabricView,
    options: Options,
    comm: CommSpec,
    *,
    seen: _Members,
    rails: list[int | None],
) -> tuple[coord.MitigationPlan, tuple[dict[int, int], int] | None]:
    """The coordination model's plan for the communicator, NVL transit offered where the
    moved ranks have NVLink peers and the ranks did not refuse it; and those transit GPUs."""
    _, failed_by_node, worst, at_worst, moved, node_count = seen
    share = job.comm_share if job.comm_share is not None else 0.3
    no_transit = {} if job.mode == Mode.RESTARTING else job.previous.no_transit
    load = Counter(r.active for r in at_worst if r.active)
    crosses = any((fabric.plans[r.node].for_gpu(r.gpu).backup_cost or 0) >= 100 for r in moved)
    topo = fabric.topologies[worst]
    nvlink = any(g.nvlink for g in topo.gpus)
    transit = transit_gpus(moved, fabric) if moved and len(rails) < 2 else None
    offered = nvlink and len(rails) < 2 and transit is not None
    refused = no_transit.get(comm.comm_id)
    plan = coord.plan_mitigation(
        comm_share=share,
        rails_per_node=len(rails),
        failed_rails=len(failed_by_node[worst]),
        channels=comm.channels,
        nodes=node_count,
        backup_load=max(load.values(), default=1),
        backup_crosses_root_complex=crosses,
        nvl_available=offered and refused is None,
        nvl_mb_per_channel=options.nvl_mb_per_channel,
        nvl_cap_mb=job.nvl_cap_mb if job.nvl_cap_mb is not None else options.nvl_cap_mb,
        nvl_ranks_per_gpu=transit[1] if transit else 1,
    )
    if offered and refused is not None:
        plan = _transit_refused(plan, refused)
    return plan, transit


def _transit_refused(plan: coord.MitigationPlan, why: str) -> coord.MitigationPlan:
    """The plan with NVL transit shown as the ranks' refusal, not as unavailable."""
    options = tuple(
        coord.Option(o.mitigation, False, None, f"refused by the ranks ({why}): s-Bond only")
        if o.mitigation == coord.Mitigation.NVL
        else o
        for o in plan.options
    )
    return replace(plan, options=options)


# What plan_mitigations reads of one communicator's members: their ranks, the rails
# failed per node, the worst node and its members, the members moved to their backup,
# and how many nodes the members are on.
_Members = tuple[
    tuple[int, ...], dict[str, set[int | None]], str, list[RankRoute], list[RankRoute], int
]


def _members(comm: CommSpec, by_rank: Mapping[int, RankRoute]) -> _Members | None:
    members = [by_rank[r] for r in (comm.ranks or sorted(by_rank)) if r in by_rank]
    nodes: set[str] = set()
    failed_by_node: dict[str, set[int | None]] = {}
    for r in members:
        nodes.add(r.node)
        if not r.primary_ok and r.primary is not None:
            failed_by_node.setdefault(r.node, set()).add(r.rail)
    if not failed_by_node:
        return None
    worst = max(failed_by_node, key=lambda n: (len(failed_by_node[n]), n))
    return (
        tuple(r.rank for r in members),
        failed_by_node,
        worst,
        [r for r in members if r.node == worst],
        [r for r in members if not r.primary_ok and r.backup_ok],
        len(nodes),
    )


def _members_indexed(conn: Connectivity, index: JobIndex, comm: CommIndex) -> _Members | None:
    """_members from the routes that lack an endpoint: the others fail nothing and move nowhere."""
    order = comm.order
    odd = sorted((r for r in odd_routes(conn) if r.rank in order), key=lambda r: order[r.rank])
    failed_by_node: dict[str, set[int | None]] = {}
    for r in odd:
        if not r.primary_ok and r.primary is not None:
            failed_by_node.setdefault(r.node, set()).add(r.rail)
    if not failed_by_node:
        return None
    worst = max(failed_by_node, key=lambda n: (len(failed_by_node[n]), n))
    at_worst = sorted(
        (conn.routes[i] for i in index.by_node.get(worst, ()) if conn.routes[i].rank in order),
        key=lambda r: order[r.rank],
    )
    moved = [r for r in odd if not r.primary_ok and r.backup_ok]
    return comm.ranks, failed_by_node, worst, at_worst, moved, comm.nodes


def with_mitigations(
    job: JobState,
    fabric: FabricView,
    conn: Connectivity,
    base: Desired,
    moved: dict[int, str],
    *,
    options: Options,
) -> Desired:
    if job.nccl is not None:
        # Stock NCCL moves its traffic itself and takes no channel plan.
        return replace(base, moved=dict(moved), disabled={}, mitigation={}, **NO_PLAN)
    plans = plan_mitigations(job, fabric, conn, options)
    # Only a job that registered its communicators can be told a switch point.
    disabled = {
        p.comm_id: p.disabled_channels
        for p in plans
        if p.disabled_channels and p.comm_id != IMPLICIT_COMM
    }
    mitigation = {p.comm_id: p.plan.chosen.mitigation.value for p in plans}
    told = [p for p in plans if p.comm_id != IMPLICIT_COMM]
    return replace(
        base,
        moved=dict(moved),
        disabled=disabled,
        mitigation=mitigation,
        weights={p.comm_id: p.weights for p in told if p.weights},
        split={p.comm_id: p.split_ratio for p in told if p.weights and p.split_ratio},
        transit={p.comm_id: dict(p.transit) for p in told if p.transit},
    )


def describe(
    desired: Desired, fabric: FabricView, job: JobState, conn: Connectivity, options: Options
) -> dict[str, Any]:
    return {
        "communicators": [
            {
                "comm_id": p.comm_id,
                "mitigation": p.plan.chosen.mitigation.value,
                "predicted_k": p.plan.chosen.k,
                "why": p.plan.reason,
                # A communicator the job did not register is planned, but not told.
                "disabled_channels": list(p.disabled_channels),
                "channel_weights": list(p.weights),
                "allreduce_split": p.split_ratio if p.weights else None,
                "transit": [{"rank": r, "gpu": g} for r, g in sorted(p.transit.items())],
                "options": [
                    {
                        "mitigation": o.mitigation.value,
                        "applicable": o.applicable,
                        "k": o.k,
                        "why": o.why,
                        **o.detail,
                    }
                    for o in p.plan.options
                ],
            }
            for p in plan_mitigations(job, fabric, conn, options)
        ]
    }
