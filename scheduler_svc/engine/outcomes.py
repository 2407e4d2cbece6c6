"""The outcomes of a reconcile pass, each with the decision it records.

`cost_decision` asks the cost model (ReCCL eq. (1)-(4)) whether to fail over or
restart for what is failed right now; `failover` moves ranks (or changes channels)
when nothing new asks that question; `failback` returns the ranks whose primary is
healthy again; `at_checkpoint` re-decides at a checkpoint while failed over.
`reconcile` (engine/reconcile.py) picks which one a pass ends in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from scheduler_svc.engine import coordination as coord
from scheduler_svc.engine import decision as cost
from scheduler_svc.engine import layout, nccl
from scheduler_svc.engine.evidence import affects, job_nodes, known, node_failure_note
from scheduler_svc.engine.fabric import Unhealthy
from scheduler_svc.engine.job_routes import job_bandwidth_left, primary_ok, routes_by_rank
from scheduler_svc.engine.jobindex import odd_routes
from scheduler_svc.engine.mitigations import describe, with_mitigations
from scheduler_svc.engine.records import cost_plan, inputs_now, inputs_record, moved_plan
from scheduler_svc.engine.routes import Connectivity, RankRoute
from scheduler_svc.engine.slowdown import SlowdownEstimate, estimate_k
from scheduler_svc.engine.state import (
    NO_PLAN,
    Action,
    CheckpointSeen,
    DecisionRecord,
    Desired,
    FabricView,
    JobState,
    Mode,
    Options,
    Reconciled,
    usable_checkpoint_at,
)


@dataclass(frozen=True, slots=True)
class ReconcilePass:
    """One call's arguments and what every outcome below reads from them."""

    now: datetime
    job: JobState
    fabric: FabricView
    conn: Connectivity
    options: Options
    warnings: tuple[str, ...]
    evidence: tuple[Unhealthy, ...]


# --- the outcomes -----------------------------------------------------------------------------


def cost_decision(
    p: ReconcilePass,
    base: Desired,
    moved: dict[int, str],
    *,
    at: datetime,
    first: Unhealthy | None,
    note: str | None,
    trigger: str | None = None,
    planned: bool = False,
) -> Reconciled:
    """Failover against restart by ReCCL eq. (1)-(4), for what is failed right now."""
    asked = _ask_cost_model(p, at=at, planned=planned)
    reasons = _reasons(p, asked, note)
    plan = cost_plan(
        p.conn,
        asked.bw,
        asked.estimate.detail,
        asked.result,
        evidence=p.evidence,
        warnings=p.warnings,
    )
    if asked.domain is not None:  # NCCL's own failover is the plan: no channels, no switch points
        reasons.insert(0, asked.domain.reason)
        plan.update(mitigation="nccl", failed_over=[], nccl=asked.domain.record())
    name = trigger or (first.key if first is not None else f"state:{p.now.isoformat()}")
    return _answer(p, asked, _Told(name, first, reasons, plan), base, moved)


@dataclass(frozen=True, slots=True)
class _Asked:
    """The cost model's answer for what is failed now, and what it was asked with."""

    inputs: cost.DecisionInputs
    result: cost.Decision
    estimate: SlowdownEstimate
    concurrent: int  # faults counted, a failed switch's port faults as that one
    bw: float | None  # bandwidth left, when the job said its communication share
    domain: nccl.NcclAssessment | None  # stock NCCL's own failover domain
    scaled: layout.ScaledPlan | None  # a restart without the faulty nodes, if allowed


@dataclass(frozen=True, slots=True)
class _Told:
    """What the decision record says: its trigger, the evidence it names, its reasons and
    its plan (both still filled in by the outcome)."""

    name: str
    first: Unhealthy | None
    reasons: list[str]
    plan: dict[str, Any]


def _ask_cost_model(p: ReconcilePass, *, at: datetime, planned: bool) -> _Asked:
    job, fabric, conn, options = p.job, p.fabric, p.conn, p.options
    concurrent = _concurrent_faults(p)
    bw = job_bandwidth_left(conn, fabric) if job.comm_share is not None else None
    k_now = job.measured_k if job.measured_k is not None else job.slowdown_k
    estimate = estimate_k(
        measured_k=k_now,
        comm_share=job.comm_share,
        bandwidth_left=bw if bw is None or bw > 0 else None,
        concurrent_faults=max(1, concurrent),
        table=options.default_k,
    )
    path_available, affected, domain = _paths_left(p)
    elapsed = max(0.0, (at - usable_checkpoint_at(job)).total_seconds())
    scaled = scaled_plan(job, conn) if job.allow_scaling else None
    inputs = cost.DecisionInputs(
        checkpoint_interval_s=job.checkpoint_interval_s,
        elapsed_s=elapsed,
        detect_s=job.detect_s,
        reload_s=job.reload_s,
        timeout_s=job.timeout_s,
        k=estimate.k,
        k_source=estimate.source.value,
        gpus=max(1, len(conn.routes)),
        path_available=path_available,
        affected=affected,
        dp_size=job.dp_size,
        new_dp_size=None if scaled is None else scaled.new_dp_size,
        allow_scaling=job.allow_scaling,
        spare_nodes=job.spare_nodes,
        spares_free=job.spares_free,
        spare_reserve=options.spare_reserve,
        node_replace_s=job.node_replace_s,
        spare_price_s=_spare_price_s(job, options),
        planned=planned,
    )
    result = cost.with_policy(cost.decide(inputs), options.policy)
    return _Asked(inputs, result, estimate, concurrent, bw, domain, scaled)


def _concurrent_faults(p: ReconcilePass) -> int:
    """The faults that touch the job, counted for k."""
    # A degraded part is no fault for k: it is rebalanced around, or counted failed.
    affecting = [u for u in p.evidence if u.kind != "degraded" and affects(u, p.conn, p.fabric)]
    # Port faults on a switch known to have failed are that one failure, not more.
    failed_switches = {u.switch for u in affecting if u.kind == "switch"}
    return len([u for u in affecting if u.kind == "switch" or u.switch not in failed_switches])


def _paths_left(p: ReconcilePass) -> tuple[bool, bool, nccl.NcclAssessment | None]:
    """Whether every pair keeps a path, whether the job is touched at all, and for stock
    NCCL its own failover domain, which answers both in place of s-Bond's paths."""
    job, fabric, conn = p.job, p.fabric, p.conn
    affected = bool(conn.failed_over_ranks or conn.isolated_ranks or conn.broken_pairs)
    path_available = conn.all_pairs_survive and not conn.isolated_ranks
    if job.nccl is None:
        return path_available, affected, None
    domain = nccl.assess_job(job.nccl, fabric.topologies, fabric.failed, conn.routes)
    # NCCL fails over between NICs; a rank whose GPU is gone has no path under any.
    gone = any((r.node, r.gpu) in fabric.failed.gpus for r in conn.routes)
    return domain.path_available and not gone, domain.affected or gone, domain


def _reasons(p: ReconcilePass, asked: _Asked, note: str | None) -> list[str]:
    """The decision's reason, in parts: what the paths and nodes say first, the cost
    model's reason last."""
    conn = p.conn
    reasons = [asked.result.reason]
    if asked.domain is None and not conn.all_pairs_survive:
        reasons.insert(
            0,
            f"{conn.broken_pairs} rank pair(s) across nodes have no path left "
            f"({len(conn.isolated_ranks)} rank(s) lost both RNICs)",
        )
    dead = node_failure_note(p.evidence, p.fabric, job_nodes(p.job, conn))
    if dead:
        reasons.insert(0, dead)
    if note:
        reasons.insert(0, note)
    return reasons


def _answer(
    p: ReconcilePass, asked: _Asked, told: _Told, base: Desired, moved: dict[int, str]
) -> Reconciled:
    """The desired state the cost model's answer leads to, recorded."""
    result, scaled, estimate, plan = asked.result, asked.scaled, asked.estimate, told.plan
    if result.action == cost.Action.RESTART_SCALED:
        assert scaled is not None  # decide() offers it only with a new DP size
        # What the fleet manager executes: requeue without these nodes, at this DP size.
        plan.update(
            drop_nodes=list(scaled.drop_nodes),
            new_dp_size=scaled.new_dp_size,
            dropped_replicas=list(scaled.dropped_replicas),
        )
        told.reasons[-1] += (
            f"; drop {', '.join(scaled.drop_nodes)} (DP replicas "
            f"{', '.join(map(str, scaled.dropped_replicas))}): "
            f"DP {scaled.dp_size} -> {scaled.new_dp_size}"
        )
    if result.action in (cost.Action.RESTART, cost.Action.RESTART_SCALED):
        restarting = replace(
            base,
            mode=Mode.RESTARTING,
            moved={},
            disabled={},
            mitigation={},
            **NO_PLAN,
            k=estimate.k,
            # Every evidence known now, windows announced on the job's parts included: an
            # incarnation placed back on any of it is not restarted for it again.
            restarted_for=base.restarted_for | known(p.job, p.conn, p.fabric, p.evidence),
        )
        return _recorded(
            p, asked, told, base, action=Action(result.action.value), desired=restarting
        )
    if result.action == cost.Action.NONE:
        # Only backups lost: say why, change nothing but the k it rests on (a measured k
        # that decided "none" would otherwise decide it again on every pass).
        return _recorded(
            p, asked, told, base, action=Action.NONE, desired=replace(base, k=estimate.k)
        )
    if asked.domain is not None:
        nccl_desired = replace(base, mode=Mode.FAILED_OVER, moved=dict(moved), k=estimate.k)
        return _recorded(p, asked, told, base, action=Action.FAILOVER, desired=nccl_desired)
    desired = with_mitigations(
        p.job,
        p.fabric,
        p.conn,
        replace(base, mode=Mode.FAILED_OVER, k=estimate.k),
        moved,
        options=p.options,
    )
    plan.update(describe(desired, p.fabric, p.job, p.conn, p.options))
    if desired.mitigation:
        plan["mitigation"] = next(iter(dict(sorted(desired.mitigation.items())).values()))
    return _recorded(p, asked, told, base, action=Action.FAILOVER, desired=desired)


def _recorded(
    p: ReconcilePass,
    asked: _Asked,
    told: _Told,
    base: Desired,
    *,
    action: Action,
    desired: Desired,
) -> Reconciled:
    result = asked.result
    costs = dict(result.costs_s)
    changed = dict(desired.moved) != dict(base.moved)
    return Reconciled(
        desired,
        DecisionRecord(
            told.name,
            action,
            ": ".join(told.reasons),
            inputs=inputs_record(result, asked.concurrent),
            costs_s=costs,
            costs_gpu_s=dict(result.costs_gpu_s),
            plan=told.plan,
            fault_key=None if told.first is None else told.first.key,
            saved_gpu_s=cost.saved_gpu_s(action.value, costs, asked.inputs.gpus, moved=changed),
        ),
        p.conn,
        p.warnings,
    )


def scaled_plan(job: JobState, conn: Connectivity) -> layout.ScaledPlan | None:
    """Restart without the nodes whose failed part leaves some rank off its primary."""
    drop = {r.node for r in odd_routes(conn) if not r.primary_ok}
    return layout.scaled_plan(
        job.ranks, drop, dp_size=job.dp_size, tp_size=job.tp_size, pp_size=job.pp_size
    )


def failover(
    p: ReconcilePass, base: Desired, moved: dict[int, str], *, note: str | None
) -> Reconciled:
    """Ranks move (or channels change) without new evidence: no cost question to ask."""
    now, job, fabric, conn, options, warnings = (
        p.now,
        p.job,
        p.fabric,
        p.conn,
        p.options,
        p.warnings,
    )
    desired = with_mitigations(
        job, fabric, conn, replace(base, mode=Mode.FAILED_OVER), moved, options=options
    )
    plan = {
        "mitigation": next(iter(desired.mitigation.values()), "s-bond"),
        "failed_over": moved_plan(conn),
        "warnings": list(warnings),
    }
    plan.update(describe(desired, fabric, job, conn, options))
    return Reconciled(
        desired,
        DecisionRecord(
            f"replan:{now.isoformat()}",
            Action.FAILOVER,
            note or "ranks follow the paths the open faults leave them (nothing new failed)",
            inputs=inputs_now(now, job, options, base.k),
            costs_s={},
            costs_gpu_s={},
            plan=plan,
        ),
        conn,
        warnings,
    )


def failback(
    p: ReconcilePass, prev: Desired, base: Desired, moved: dict[int, str], returning: list[int]
) -> Reconciled:
    """Ranks whose primary is healthy return; channels of rails still failed stay disabled."""
    now, job, fabric, conn, options, warnings = (
        p.now,
        p.job,
        p.fabric,
        p.conn,
        p.options,
        p.warnings,
    )
    by_rank = routes_by_rank(conn, returning)
    gone = sorted(prev.evidence - base.evidence)
    still = sorted(moved)
    # Primary healthy, kept on the backup until their communicator can return (_held).
    held = sorted(primary_ok(conn, still))
    if still:
        desired = with_mitigations(
            job, fabric, conn, replace(base, mode=Mode.FAILED_OVER), moved, options=options
        )
    else:
        desired = replace(
            base, mode=Mode.NORMAL, moved={}, disabled={}, mitigation={}, **NO_PLAN, k=None
        )
    plan: dict[str, Any] = {
        "mitigation": "failback",
        "returning": [
            {"rank": r, "node": by_rank[r].node, "gpu": by_rank[r].gpu, "to": by_rank[r].primary}
            for r in returning
            if r in by_rank
        ],
        "still_failed_over": still,
        "held": held,
        "disabled_channels": {str(c): list(d) for c, d in sorted(desired.disabled.items()) if d},
        "cleared": gone,
    }
    reason = _failback_reason(job, returning, by_rank, still=still, held=held)
    if job.nccl is not None and not still and not job.nccl.recovers_ports:
        desired = replace(desired, mode=Mode.FAILED_OVER)
    trigger = f"failback:{gone[0].split(':', 1)[1]}" if gone else f"failback:{now.isoformat()}"
    if gone and not gone[0].startswith("fault:"):
        trigger = f"failback:{gone[0]}"
    return Reconciled(
        desired,
        DecisionRecord(
            trigger,
            Action.FAILBACK,
            reason,
            inputs=inputs_now(now, job, options, prev.k),
            costs_s={},
            costs_gpu_s={},
            plan=plan,
            fault_key=gone[0] if gone else None,
        ),
        conn,
        warnings,
    )


def _failback_reason(
    job: JobState,
    returning: list[int],
    by_rank: Mapping[int, RankRoute],
    *,
    still: list[int],
    held: list[int],
) -> str:
    if job.nccl is not None:
        # NCCL recovers the port itself (2.30+) or keeps the partner device until the job
        # restarts; either way Railover only records it.
        where = ", ".join(
            sorted({f"{by_rank[r].node}/{by_rank[r].primary}" for r in returning if r in by_rank})
        )
        return f"fail back: {nccl.failback_note(job.nccl, where)}"
    nodes = sorted({by_rank[r].node for r in returning if r in by_rank})
    what = ", ".join(nodes)
    reason = (
        f"fail back: the primary paths on {what} are healthy again; "
        f"{len(returning)} rank(s) return to their primary at one op count"
    )
    if len(still) > len(held):
        reason += (
            f"; {len(still) - len(held)} rank(s) stay on their backup "
            "(their primary is still failed)"
        )
    if held:
        reason += (
            f"; {len(held)} rank(s) wait on their backup until every rank of their "
            "communicator can return (no channel plan keeps the failed rail out)"
        )
    return reason


def at_checkpoint(
    p: ReconcilePass, desired: Desired, prev: Desired, cp: CheckpointSeen
) -> Reconciled:
    """Restart onto healthy hardware at this checkpoint, or run degraded until the repair.

    A restart is worth it only where it escapes the fault: a spare node the fleet
    manager can put in the faulty one's place (it excludes it: Slurm's ExcNodeList, a
    Kubernetes taint), or a scaled restart without it. And the same evidence restarts a
    job once: an incarnation placed back on it runs degraded. The repair clock runs from
    the oldest evidence the job runs degraded on, whatever incarnations came since.
    """
    job, conn, options, warnings = p.job, p.conn, p.options, p.warnings
    k = job.measured_k or prev.k or job.slowdown_k or options.default_k[0]
    remaining = _repair_left(p, cp)
    restart, reason = _restart_at(p, prev, k, remaining)
    verdict = "restart" if restart else "keep"
    seen = replace(desired, checkpoint_id=cp.id, verdict=verdict, k=k)
    if restart:
        seen = replace(
            seen,
            mode=Mode.RESTARTING,
            moved={},
            disabled={},
            mitigation={},
            **NO_PLAN,
            restarted_for=prev.restarted_for | known(job, conn, p.fabric, p.evidence),
        )
    elif prev.verdict == "keep":
        # The answer stands, whatever k it now rests on: a FlowCheck job checkpointing
        # every iteration gets one decision.
        return Reconciled(seen, None, conn, warnings)
    return Reconciled(
        seen,
        DecisionRecord(
            f"checkpoint:{cp.id}",
            Action.RESTART if restart else Action.NONE,
            reason,
            inputs=inputs_now(cp.at, job, options, k),
            costs_s={"restart": job.reload_s, "failover": (k - 1) * remaining},
            costs_gpu_s={},
            plan={"repair_in_s": remaining, "k": k},
        ),
        conn,
        warnings,
    )


def _repair_left(p: ReconcilePass, cp: CheckpointSeen) -> float:
    """Seconds until the repair at the checkpoint, its clock started by the oldest evidence."""
    job = p.job
    repair = _repair_s(job, p.options)
    assert job.failed_over_at is not None
    broken_since = min([job.failed_over_at, *(u.since for u in p.evidence)])
    degraded_for = max(0.0, (cp.at - broken_since).total_seconds())
    remaining = max(0.0, repair - degraded_for)
    if p.evidence and all(u.clears_at is not None for u in p.evidence):
        # Every cause is gone already (a flap's port is back): the repair is the damping
        # or quiet period left, not a field engineer's day.
        clears = max(u.clears_at for u in p.evidence if u.clears_at is not None)
        remaining = min(remaining, max(0.0, (clears - cp.at).total_seconds()))
    return remaining


def _repair_s(job: JobState, options: Options) -> float:
    """How long the repair of what the job failed over from takes, from its start: the
    job's estimate, else the service's default."""
    return job.repair_estimate_s or options.default_repair_s


def _spare_price_s(job: JobState, options: Options, repair_s: float | None = None) -> float:
    """What a restart taking one of the job's free spares costs the fleet's lost GPUs and
    dead nodes (decision.spare_price_s): the spare is theirs again once the node it
    replaces is repaired, `repair_s` from now (by default the job's repair estimate)."""
    hold = repair_s if repair_s is not None else _repair_s(job, options)
    return cost.spare_price_s(
        job.spares_free, options.hard_failures_per_h, hold, job.node_replace_s
    )


def _restart_at(p: ReconcilePass, prev: Desired, k: float, remaining: float) -> tuple[bool, str]:
    """Whether to restart at the checkpoint, and why: the cost question first, then the
    policy, one restart per evidence, and whether a restart escapes the fault."""
    job, options = p.job, p.options
    spare = cost.spare_usable(
        job.spare_nodes, job.spares_free, options.spare_reserve, can_fail_over=True
    )
    restart, reason = coord.restart_at_checkpoint(
        k=k,
        reload_s=job.reload_s,
        repair_s=remaining,
        spare_price_s=_spare_price_s(job, options, remaining) if spare else 0.0,
    )
    keys = frozenset(u.key for u in p.evidence)
    if restart and not options.policy.restarts_at_checkpoints:
        restart = False
        reason = f"keep running degraded: policy {options.policy.value} never restarts a job "
        reason += "at a checkpoint"
    elif restart and keys and keys <= prev.restarted_for:
        restart = False
        reason = (
            "keep running degraded: a restart was already decided for this evidence, and "
            "the job came back on it"
        )
    elif restart and any(u.kind == "switch" for u in p.evidence):
        restart = False
        reason = (
            "keep running degraded: a restart cannot escape a switch failure (every node "
            f"under the switch would need a spare): {reason}"
        )
    elif restart and not (spare or (job.allow_scaling and scaled_plan(job, p.conn))):
        restart = False
        reason = (
            "keep running degraded: a restart cannot escape the fault (no spare node to "
            f"take the faulty one's place{_beyond_reserve(job, p.options)}, and no scaled "
            f"restart): {reason}"
        )
    return restart, reason


def _beyond_reserve(job: JobState, options: Options) -> str:
    """Why a free spare is not one to take (only the reserve can say no to one)."""
    if job.spare_nodes:
        return f" beyond the {options.spare_reserve} kept back, of {job.spares_free} free"
    return ""
