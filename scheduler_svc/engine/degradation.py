"""Degraded RNICs, pure: rebalance the channels by the bandwidth each RNIC has left
(R²CCL-Balance), or fail over where that is cheaper.

A degraded part (its port renegotiated below the rate it registered with, its PCIe link
trained below its maximum, its error counters rising past their limit) keeps working at
part of its bandwidth (`fabric.Degraded.share`). Each communicator with a member on
such an RNIC is planned at its worst node (the least bandwidth left over the rails it
uses there):

- with two rails or more there, its channels are reweighted (`channel_weights`): the
  degraded RNIC keeps its former share scaled by what it has left, and what it gives up
  goes to the RNICs at full bandwidth. k is modelled from the pace of the slowest RNIC;
- with one rail, nothing can be reweighted: it runs at the share left;
- failing over moves the degraded RNIC's ranks to their backups, as for a failed port:
  the other rails share its channels (DCR, (n - d)/n of the bandwidth), or, with one
  rail, the backup carries its own GPU's traffic too (half).

The smaller predicted k wins (`slowdown.modelled_k`, the communication share the job
reported or 30 %): a failover only where the share left is below what the backups give,
which is only ever the one-rail case. `failing_over` counts those RNICs failed for the
job; `rebalanced` is the outcome for a job with nobody off its primary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from scheduler_svc.engine.fabric import Degraded, Unhealthy
from scheduler_svc.engine.mitigations import channel_weights, rnic_shares
from scheduler_svc.engine.outcomes import ReconcilePass
from scheduler_svc.engine.records import inputs_now
from scheduler_svc.engine.routes import Connectivity, RankRoute
from scheduler_svc.engine.slowdown import modelled_k
from scheduler_svc.engine.state import (
    IMPLICIT_COMM,
    Action,
    CommSpec,
    DecisionRecord,
    Desired,
    FabricView,
    JobState,
    Mode,
    Reconciled,
    comms_of,
)

# The communication share assumed when the job reported none (as the mitigations do).
DEFAULT_COMM_SHARE = 0.3
# With one rail, a failed-over rank shares its backup with the GPU whose primary it is.
ONE_RAIL_BACKUP_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class CommDegraded:
    """One communicator's answer to the degradation on its worst node."""

    comm_id: int
    node: str
    weights: tuple[float, ...]  # empty: nothing to reweight (one rail, or failing over)
    k_rebalance: float
    k_failover: float
    # The degraded RNICs ("device/port") on `node` its members use, with their shares.
    shares: Mapping[str, float]
    # The RNIC each channel leaves `node` through (weights, where there are some).
    channel_rnics: tuple[str | None, ...] = ()

    @property
    def fails_over(self) -> bool:
        return self.k_failover < self.k_rebalance


def degraded_on(fabric: FabricView, nodes: set[str]) -> list[Degraded]:
    """The degradations on `nodes`, weakest first."""
    found = {d.key: d for (n, _, _), d in fabric.degraded.items() if n in nodes}
    return sorted(found.values(), key=lambda d: (d.share, d.key))


def plan_degraded(job: JobState, fabric: FabricView, conn: Connectivity) -> list[CommDegraded]:
    """Per communicator with a member on a degraded RNIC: its weights, and both k."""
    if not fabric.degraded:
        return []
    share = job.comm_share if job.comm_share is not None else DEFAULT_COMM_SHARE
    by_rank = {r.rank: r for r in conn.routes}
    out = []
    for comm in comms_of(job):
        members = [by_rank[r] for r in (comm.ranks or sorted(by_rank)) if r in by_rank]
        found = _worst_node(fabric, members)
        if found is not None:
            out.append(_plan_comm(comm, share, *found))
    return out


def _worst_node(
    fabric: FabricView, members: Sequence[RankRoute]
) -> tuple[str, list[str | None], dict[str, float]] | None:
    """The node where the members have the least bandwidth left, the RNIC of each rail
    they use there (in rail order), and the shares of the degraded ones."""
    worst: tuple[float, str, list[str | None], dict[str, float]] | None = None
    for node in sorted({r.node for r in members}):
        at = {r.rail: r.active for r in members if r.node == node}
        rnics = [at[rail] for rail in sorted(at, key=lambda x: (x is None, x))]
        shares = rnic_shares(fabric, node, rnics)
        if not shares:
            continue
        left = sum(shares.get(k, 1.0) for k in rnics if k is not None) / max(1, len(rnics))
        if worst is None or left < worst[0]:
            worst = (left, node, rnics, shares)
    return None if worst is None else worst[1:]


def _plan_comm(
    comm: CommSpec,
    comm_share: float,
    node: str,
    rnics: list[str | None],
    shares: dict[str, float],
) -> CommDegraded:
    n = len(rnics)
    if n < 2:
        # One rail: nothing to reweight. Running on, the rail runs at its share; failed
        # over, the backup carries its own GPU's traffic too.
        left = min(shares.values())
        return CommDegraded(
            comm.comm_id,
            node,
            (),
            _k(comm_share, left),
            _k(comm_share, ONE_RAIL_BACKUP_SHARE),
            shares,
            tuple(rnics),
        )
    through = [rnics[c % n] for c in range(comm.channels)]
    weights = channel_weights(through, shares)
    # The pace is the slowest RNIC's: its traffic share over the bandwidth it has left,
    # against the even share at full bandwidth.
    per_rnic: dict[str, float] = {}
    for k, w in zip(through, weights, strict=True):
        if k is not None:
            per_rnic[k] = per_rnic.get(k, 0.0) + w
    even = 1.0 / len(per_rnic) if per_rnic else 1.0
    slowest = max((w / max(shares.get(k, 1.0), 1e-9) for k, w in per_rnic.items()), default=even)
    degraded = sum(1 for k in per_rnic if k in shares)
    return CommDegraded(
        comm.comm_id,
        node,
        weights,
        _k(comm_share, min(1.0, even / slowest)),
        _k(comm_share, max(1e-9, (len(per_rnic) - degraded) / len(per_rnic))),
        shares,
        tuple(through),
    )


def _k(comm_share: float, bandwidth_left: float) -> float:
    return modelled_k(comm_share, min(1.0, max(1e-9, bandwidth_left)))


def failing_over(job: JobState, fabric: FabricView, conn: Connectivity) -> FabricView:
    """The fabric with the degraded RNICs that are cheaper to fail over than to run on
    counted failed, for this job alone (the pass then moves their ranks as for a failure)."""
    if job.mode == Mode.RESTARTING or job.nccl is not None:
        return fabric
    links = {
        (p.node, *_device_port(k))
        for p in plan_degraded(job, fabric, conn)
        if p.fails_over
        for k in p.shares
    }
    if not links or links <= fabric.failed.links:
        return fabric
    return replace(fabric, failed=replace(fabric.failed, links=fabric.failed.links | links))


def _device_port(key: str) -> tuple[str, int]:
    dev, _, port = key.partition("/")
    return dev, int(port or 0)


def told_weights(plans: Sequence[CommDegraded], job: JobState) -> dict[int, tuple[float, ...]]:
    """The weights the job's registered communicators are told (none where they refused
    weights before: they run as they are)."""
    no_balance = job.previous.no_balance
    return {
        p.comm_id: p.weights
        for p in plans
        if p.weights
        and not p.fails_over
        and p.comm_id != IMPLICIT_COMM
        and p.comm_id not in no_balance
    }


# --- the outcomes --------------------------------------------------------------------------------


def rebalanced(p: ReconcilePass, prev: Desired, base: Desired) -> Reconciled | None:
    """A job with nobody off its primary whose channel weights the degradations change:
    one REBALANCE decision, the weights to every rank of each communicator at one switch
    point (none: the job keeps what it has)."""
    job = p.job
    if job.nccl is not None or job.mode == Mode.RESTARTING:
        return None
    plans = plan_degraded(job, p.fabric, p.conn)
    weights = told_weights(plans, job)
    if weights == prev.channel_plan()[0] and not prev.split and not prev.disabled:
        return None
    desired = replace(
        base,
        mode=Mode.NORMAL,
        disabled={},
        weights=weights,
        split={},
        transit={},
        mitigation=dict.fromkeys(weights, "balance"),
    )
    told = [pl for pl in plans if pl.comm_id in weights]
    worst = degraded_on(p.fabric, {pl.node for pl in told})
    if told and worst:
        trigger = f"rebalance:{worst[0].key}"
        reason = _rebalance_reason(worst, told)
    else:
        gone = sorted(prev.evidence - base.evidence)
        trigger = f"rebalance:restored:{gone[0] if gone else p.now.isoformat()}"
        reason = (
            "no RNIC the communicators use is degraded any more"
            + (f" ({', '.join(gone)} cleared)" if gone else "")
            + ": every channel back to an even share"
        )
    plan: dict[str, Any] = {
        "mitigation": "balance" if weights else "even",
        "degraded": [
            {"fault": d.key, "part": d.label, "share": d.share, "figure": d.figure} for d in worst
        ],
        "communicators": [
            {
                "comm_id": pl.comm_id,
                "node": pl.node,
                "channel_weights": list(pl.weights),
                "k_rebalance": pl.k_rebalance,
                "k_failover": pl.k_failover,
                "shares": dict(pl.shares),
            }
            for pl in told
        ],
    }
    record = DecisionRecord(
        trigger,
        Action.REBALANCE,
        reason,
        inputs=inputs_now(p.now, job, p.options, base.k),
        costs_s={},
        costs_gpu_s={},
        plan=plan,
        fault_key=worst[0].key if told and worst else None,
    )
    return Reconciled(desired, record, p.conn, p.warnings)


def _rebalance_reason(worst: Sequence[Degraded], told: Sequence[CommDegraded]) -> str:
    figures = "; ".join(d.figure for d in worst)
    parts = []
    for pl in told:
        even = 1.0 / max(1, len(_rnics_of(pl)))
        shares = ", ".join(
            f"{pl.node}/{k} {_rnic_weight(pl, k):.1%} of the traffic (was {even:.1%})"
            for k in sorted(pl.shares)
        )
        parts.append(
            f"communicator {pl.comm_id}: {shares}; predicted k {pl.k_rebalance:.3f} "
            f"(failing over {pl.k_failover:.3f})"
        )
    return (
        f"{figures}: channels rebalanced by the bandwidth each RNIC has left, not failed "
        f"over; {'; '.join(parts)}"
    )


def _rnics_of(pl: CommDegraded) -> set[str]:
    return {k for k in pl.channel_rnics if k is not None}


def _rnic_weight(pl: CommDegraded, key: str) -> float:
    return sum(w for k, w in zip(pl.channel_rnics, pl.weights, strict=True) if k == key)


def failover_note(
    evidence: Sequence[Unhealthy], fabric: FabricView, comm_share: float | None
) -> str:
    """Why a degradation moved ranks: the figure, and the two k it was decided by."""
    share = comm_share if comm_share is not None else DEFAULT_COMM_SHARE
    keyed = {d.key: d for d in fabric.degraded.values()}
    parts = []
    for u in evidence:
        d = keyed.get(u.key)
        if d is None:
            continue
        parts.append(
            f"{d.figure}: its ranks fail over, cheaper than running on it (one rail: "
            f"predicted k {_k(share, ONE_RAIL_BACKUP_SHARE):.3f} on the backup against "
            f"{_k(share, d.share):.3f} at {d.share:.0%} of its bandwidth)"
        )
    return "; ".join(parts) or "a degraded RNIC's ranks fail over"
