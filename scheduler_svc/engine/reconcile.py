"""A job's desired state under the fabric as it is, pure: `reconcile(now, job, fabric, options)`.

Every outcome of the fault lifecycle comes out of this one function: failover,
restart, restart with the node dropped, DCR, balance, NVL transit, fail-back
(whole or partial), staying on a quarantined backup and the re-decision at a
checkpoint or on a measured k. The service records evidence, calls it for each
job the evidence touches, stores the decision when there is one, and sends the
difference between the desired state and what it already commanded
(`intents.command_diff`). Calling it again with nothing changed returns the same
desired state and no decision, so no command either.

The desired state is what a job should look like: its mode, the RNIC every
rank that is off its primary uses, and per communicator the channels that stay
disabled, the channel weights and allreduce split of R²CCL balance, and the
transit GPU of each rank sent over NVLink. A decision is produced only when that
changes (or when a checkpoint or a measured k changes the answer to "restart or keep
running degraded").

This module is the pass (a step per row of the README's job-lifecycle table) and the
refused mitigations it plans around; the types it reads and returns are in
`engine/state.py`, the outcomes it ends in, each with its decision, in
`engine/outcomes.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from scheduler_svc.engine import coordination as coord
from scheduler_svc.engine import degradation
from scheduler_svc.engine.evidence import (
    evidence_for,
    fault_note,
    isolated_by,
    job_nodes,
    one_failure,
)
from scheduler_svc.engine.fabric import Unhealthy
from scheduler_svc.engine.job_routes import routes_by_rank, routes_of
from scheduler_svc.engine.jobindex import odd_routes
from scheduler_svc.engine.mitigations import with_mitigations
from scheduler_svc.engine.outcomes import (
    ReconcilePass,
    at_checkpoint,
    cost_decision,
    failback,
    failover,
)
from scheduler_svc.engine.records import inputs_now
from scheduler_svc.engine.routes import Connectivity, JobIndex
from scheduler_svc.engine.state import (
    IMPLICIT_COMM,
    Action,
    DecisionRecord,
    Desired,
    FabricView,
    HeldBack,
    JobState,
    Mode,
    Options,
    Reconciled,
    checkpoint_request,
)


def reconcile(
    now: datetime,
    job: JobState,
    fabric: FabricView,
    options: Options,
    index: JobIndex | None = None,
) -> Reconciled:
    """The job's desired state at `now`, and the decision when the outcome changed.

    Beside the paths, the desired state says whether a normal checkpoint is wanted
    (a FlowCheck rebuild failure no newer checkpoint answers yet). With `index` (see
    `index_for`) a fault costs the ranks it touches; the answer is the same without.
    Optional mitigations the ranks refused are planned around (`refusals`): a
    communicator that refused NVL transit runs s-Bond only, and the ranks of a refused
    fail-back stay on their backup until it is tried again; neither is a restart.
    """
    no_transit, held = refusals(now, job, options)
    fabric = _holding_back(job, fabric, held)
    if fabric.degraded:
        # A degraded RNIC cheaper to fail over than to run on counts failed for this job.
        fabric = degradation.failing_over(job, fabric, routes_of(job, fabric, index))
    out = _reconcile_paths(now, job, fabric, options, index)
    out = _with_refusals(out, job, no_transit, held, options)
    wanted = checkpoint_request(job)
    if out.desired.checkpoint_after == wanted:
        return out
    return replace(out, desired=replace(out.desired, checkpoint_after=wanted))


# --- refused optional mitigations ---------------------------------------------------------------


def refusals(
    now: datetime, job: JobState, options: Options
) -> tuple[Mapping[int, str], tuple[HeldBack, ...]]:
    """The refusals in force at `now`: the communicators that run without NVL transit,
    and the fail-backs still held back (each until failback_retry_s after it was refused).

    None while the job restarts: its next incarnation is asked afresh.
    """
    if job.mode == Mode.RESTARTING:
        return {}, ()
    retry = timedelta(seconds=options.failback_retry_s)
    held = tuple(h for h in job.previous.held if now < h.since + retry)
    return job.previous.no_transit, held


def recheck_at(desired: Desired, options: Options) -> datetime | None:
    """When the job must be reconciled again though nothing else happens: the moment a
    refused fail-back is tried again."""
    retry = timedelta(seconds=options.failback_retry_s)
    return min((h.since + retry for h in desired.held), default=None)


def _holding_back(job: JobState, fabric: FabricView, held: Sequence[HeldBack]) -> FabricView:
    """The fabric with the primaries of ranks held on their backup counted failed, for
    this job alone: every outcome then reads as it did before the refused fail-back.
    A rank whose backup failed since is not held: it returns (held, it would have no path)."""
    if not held:
        return fabric
    wanted = {r for h in held for r in h.ranks}
    failed = fabric.failed
    links: set[tuple[str, str, int]] = set()
    for rank, node, gpu in job.ranks:
        plan, topo = fabric.plans.get(node), fabric.topologies.get(node)
        if rank not in wanted or plan is None or topo is None or not plan.has_gpu(gpu):
            continue
        paths = plan.for_gpu(gpu)
        if paths.primary is None or paths.backup is None or (node, gpu) in failed.gpus:
            continue
        if failed.port_ok(node, topo.rnic(paths.backup)):
            primary = topo.rnic(paths.primary)
            links.add((node, primary.name, primary.port))
    if links <= fabric.failed.links:
        return fabric
    return replace(fabric, failed=replace(fabric.failed, links=fabric.failed.links | links))


def _with_refusals(
    out: Reconciled,
    job: JobState,
    no_transit: Mapping[int, str],
    held: tuple[HeldBack, ...],
    options: Options,
) -> Reconciled:
    """The refusals carried into the desired state (dropped at a restart), and a decision
    that only follows one of them told as such."""
    desired = out.desired
    no_balance = {} if job.mode == Mode.RESTARTING else job.previous.no_balance
    if desired.mode == Mode.RESTARTING:
        no_transit, held, no_balance = {}, (), {}
    note = _refusal_note(out, job, no_transit, held, options)
    if (
        dict(desired.no_transit) == dict(no_transit)
        and dict(desired.no_balance) == dict(no_balance)
        and desired.held == held
        and note is None
    ):
        return out
    desired = replace(desired, no_transit=dict(no_transit), no_balance=dict(no_balance), held=held)
    if note is None or out.decision is None:
        return replace(out, desired=desired)
    trigger, reason = note
    return replace(
        out, desired=desired, decision=replace(out.decision, trigger=trigger, reason=reason)
    )


def _refusal_note(
    out: Reconciled,
    job: JobState,
    no_transit: Mapping[int, str],
    held: Sequence[HeldBack],
    options: Options,
) -> tuple[str, str] | None:
    """The trigger and reason of a failover that nothing new caused but a refusal: ranks
    kept on their backup, or a communicator's NVL transit given up."""
    d, prev, desired = out.decision, job.previous, out.desired
    if d is None or d.action != Action.FAILOVER or d.fault_key is not None:
        return None
    notes: list[tuple[str, str]] = []
    retry = timedelta(seconds=options.failback_retry_s)
    for h in held:
        kept = [r for r in h.ranks if r in desired.moved and r not in prev.moved]
        if kept:
            notes.append(
                (
                    f"refused:failback:{h.comm_id}",
                    f"fail-back refused ({h.why or 'no detail'}): {len(kept)} rank(s) of "
                    f"communicator {h.comm_id} stay on their backup; it is tried again at "
                    f"{(h.since + retry).isoformat()}",
                )
            )
    for c, why in sorted(prev.no_balance.items()):
        if prev.weights.get(c) and not desired.weights.get(c):
            notes.append(
                (
                    f"refused:balance:{c}",
                    f"channel weights refused by communicator {c}'s ranks ({why}): they "
                    "run the DCR plan, its channels on failed rails off, and are not asked "
                    "for weights again",
                )
            )
    nvl = coord.Mitigation.NVL.value
    for c, why in sorted(no_transit.items()):
        if prev.mitigation.get(c) == nvl and desired.mitigation.get(c) != nvl:
            notes.append(
                (
                    f"refused:nvl_transit:{c}",
                    f"NVL transit refused by communicator {c}'s ranks ({why}): they run "
                    "s-Bond only and are not asked again",
                )
            )
    if not notes:
        return None
    return notes[0][0], "; ".join(n for _, n in notes)


# --- the pass: the README's job-lifecycle table, row by row ------------------------------------


def _reconcile_paths(
    now: datetime,
    job: JobState,
    fabric: FabricView,
    options: Options,
    index: JobIndex | None = None,
) -> Reconciled:
    conn = routes_of(job, fabric, index)
    if conn.index is not None and conn.index.plans is fabric.plans:
        warnings = conn.index.warnings
    else:
        warnings = tuple(w for n in sorted(fabric.plans) for w in fabric.plans[n].warnings)
    prev = job.previous
    new_life = False
    nodes = job_nodes(job, conn)
    evidence = tuple(evidence_for(conn, fabric, nodes))
    keys = frozenset(u.key for u in evidence)
    if job.mode == Mode.RESTARTING:
        # No restart time while restarting: the next incarnation started (the service
        # clears it when the fleet manager posts the job again, or a checkpoint names it).
        if job.restart_decided_at is not None:
            # Aborted and waiting for the fleet manager: nothing is decided for the old
            # incarnation. What breaks meanwhile is known when the new one starts (it
            # starts on the paths left).
            return Reconciled(replace(prev, evidence=keys), None, conn, warnings)
        prev = _next_incarnation(job, prev)
        new_life = True

    # A switch inferred failed is one failure with its ports' faults: restarted for one of
    # them, the job was restarted for all of it, whichever was reported first.
    prev = replace(prev, restarted_for=one_failure(prev.restarted_for, evidence))
    fresh = job.registering and not new_life and bool(keys)
    if fresh:
        # What broke before the job was registered is no news to it.
        prev = replace(prev, evidence=keys)
    p = ReconcilePass(now, job, fabric, conn, options, warnings, evidence)
    # A restart of this job was decided for some evidence: that is no news to any of its
    # incarnations, wherever the fleet manager placed them since.
    new = [u for u in evidence if u.key not in prev.evidence and u.key not in prev.restarted_for]
    moved = _moved(p, prev)
    isolated = bool(conn.isolated_ranks) or not conn.all_pairs_survive
    returning = sorted(r for r in prev.moved if r not in moved)
    newly_moved = sorted(r for r in moved if r not in prev.moved or prev.moved[r] != moved[r])

    # A new incarnation's prev is a fresh Desired, so base is in mode NORMAL then too.
    base = replace(prev, evidence=keys)
    s = _Found(p, prev, base, moved, returning, new, keys, isolated, new_life, fresh)

    # 1. Something new broke a path this job uses (or left some GPU without any): decide
    #    by the cost model, at the time the earliest new evidence appeared.
    if isolated or newly_moved:
        return _broken(s, newly_moved)
    # 2. Ranks whose primary is healthy again return to it; the others stay on backup.
    if returning:
        return failback(p, prev, base, moved, returning)
    # 3. Nobody off a primary: the channels follow the bandwidth each RNIC has left.
    if not moved:
        rebalanced = degradation.rebalanced(p, prev, base)
        if rebalanced is not None:
            return rebalanced
    return _while_failed_over(s)


@dataclass(frozen=True, slots=True)
class _Found:
    """What one pass found, read by each row of the decision table below."""

    p: ReconcilePass
    prev: Desired  # the desired state before this pass (a fresh one for a new incarnation)
    base: Desired  # prev with the evidence now known
    moved: dict[int, str]  # rank -> the backup it uses after this pass
    returning: list[int]  # ranks back on their primary
    new: list[Unhealthy]  # evidence that is news to the job
    keys: frozenset[str]
    isolated: bool  # some rank, or some pair of ranks, without a path
    new_life: bool  # the pass that starts the job's next incarnation
    fresh: bool  # the pass that registers the job, with evidence already open


def _next_incarnation(job: JobState, prev: Desired) -> Desired:
    """The new incarnation starts with every rank on its primary; evidence that was
    known at the restart is not news to it, and what a restart was decided for
    is not restarted for again."""
    cp = job.newest_checkpoint
    return Desired(
        evidence=prev.evidence,
        k=prev.k,
        checkpoint_id=cp.id if cp else None,
        # Back on what it was restarted for, it runs degraded: that is decided.
        verdict="keep" if prev.restarted_for else None,
        restarted_for=prev.restarted_for,
    )


def _moved(p: ReconcilePass, prev: Desired) -> dict[int, str]:
    """Rank -> the backup it uses after this pass: each rank whose primary failed and whose
    backup works, and the ranks that stay on their backup though their primary is back."""
    job, fabric, conn, options = p.job, p.fabric, p.conn, p.options
    moved = {
        r.rank: r.backup for r in odd_routes(conn) if not r.primary_ok and r.backup_ok and r.backup
    }
    # A rank on its backup that failed too, its primary still failed: no command helps
    # it, and a fail-back would send it onto its dead primary. It stays where it was told.
    moved.update(_stranded(conn, prev, moved))
    held = _held(job, prev, moved, fabric, conn, options=options)
    moved.update(held)
    if not options.policy.fails_back:  # NCCL keeps the partner device until a restart
        stay = routes_by_rank(conn, sorted(prev.moved))
        moved.update(
            {
                r: b
                for r, b in prev.moved.items()
                if r not in moved and r in stay and stay[r].backup_ok
            }
        )
    return moved


def _broken(s: _Found, newly_moved: list[int]) -> Reconciled:
    """Row 1: ranks moved, or some have no path left. Back on what it was restarted for,
    the job runs on what is left; moved without news, it fails over; else the cost model."""
    p, prev, keys, new, isolated = s.p, s.prev, s.keys, s.new, s.isolated
    # Evidence the job was already restarted for, and nothing new: the fleet manager
    # placed it back on that hardware. A restart would land it there again, so it runs
    # on what is left, says so once, and is not restarted for that evidence again.
    restarted_for_it = (
        isolated
        and all(u.key in prev.restarted_for for u in new)
        and (
            (bool(keys) and keys <= prev.restarted_for)  # only what it was restarted for
            or isolated_by(p.fabric, p.conn, p.evidence, prev.restarted_for)
        )
    )
    if restarted_for_it and not (s.new_life or newly_moved or s.returning):
        return Reconciled(s.base, None, p.conn, p.warnings)  # said already: nothing changed
    if restarted_for_it:
        return _back_on_what_it_was_restarted_for(s)
    if new and not isolated and all(u.kind == "degraded" for u in new):
        # Degraded parts cheaper to leave than to run on: nothing failed, no restart to weigh.
        why = degradation.failover_note(new, p.fabric, p.job.comm_share)
        return failover(p, s.base, s.moved, note=why)
    if not new and not isolated:
        # Paths moved without new evidence (a plan changed under re-registration, or a
        # restarted job starts on the paths its open faults leave): no cost question.
        note = None
        if s.new_life:
            note = "the restarted job starts on its backups: faults still open"
            if keys & prev.restarted_for:
                note += "; it is not restarted again for them"
        elif s.fresh:
            note = "the job starts on its backups: faults open before it was registered"
        return failover(p, s.base, s.moved, note=note)
    # A switch inferred failed names the decision: its port faults are that one failure.
    first = next((u for u in new if u.kind == "switch"), new[0] if new else None)
    at = min(u.since for u in new) if new else p.now
    note = fault_note(first, p.evidence)
    if s.new_life and not new:
        note = "the restarted job resumes with faults still open"
    # Only planned windows are new: the job moves ahead of them, whatever the cost model
    # would say about restarting after a fault.
    planned = bool(new) and all(u.kind == "maintenance" for u in new)
    return cost_decision(p, s.base, s.moved, at=at, first=first, note=note, planned=planned)


def _back_on_what_it_was_restarted_for(s: _Found) -> Reconciled:
    """Restarted for this evidence and placed back on it: it runs on what is left, and
    says so once."""
    p, base, moved, returning = s.p, s.base, s.moved, s.returning
    conn = p.conn
    back_on = (
        "the restarted job resumes on the faults it was restarted for, "
        + (
            f"{len(conn.isolated_ranks)} rank(s) without a usable path"
            if conn.isolated_ranks
            else "rank pairs without a usable path between them"
        )
        + ": it is not restarted again for them (place it without the faulty node)"
    )
    if moved:
        return failover(p, base, moved, note=back_on)
    if returning:  # the last on a backup can return: nobody is left there
        return failback(p, s.prev, base, moved, returning)
    # Nobody can move to a backup: it runs as placed, and that is the decision.
    record = DecisionRecord(
        f"replan:{p.now.isoformat()}",
        Action.NONE,
        back_on + "; no rank can move to a backup",
        inputs=inputs_now(p.now, p.job, p.options, base.k),
        costs_s={},
        costs_gpu_s={},
        plan={"failed_over": [], "warnings": list(p.warnings)},
    )
    return Reconciled(replace(base, mode=Mode.NORMAL), record, conn, p.warnings)


def _while_failed_over(s: _Found) -> Reconciled:
    """Rows 3 and 4: nothing moved, nobody returns; a checkpoint or a measured k may
    change the answer, and a changed channel plan is told."""
    p, prev, base, moved = s.p, s.prev, s.base, s.moved
    job, conn = p.job, p.conn
    desired = (
        with_mitigations(job, p.fabric, conn, base, moved, options=p.options) if moved else base
    )
    # 3. A checkpoint while failed over: restart cleanly now, or keep running degraded?
    # First, and with the newest k: a k measured in the same pass is decided with it here,
    # not in a second decision on the next pass.
    cp = job.newest_checkpoint
    if (
        prev.mode == Mode.FAILED_OVER
        and cp is not None
        and job.failed_over_at is not None
        and cp.at > job.failed_over_at
        and cp.id != prev.checkpoint_id
    ):
        return at_checkpoint(p, desired, prev, cp)
    # 4. A steady measured k far from the decided one asks the cost question again.
    again = _measured_k_again(s, desired)
    if again is not None:
        return again
    if not desired.same_outcome(prev) and prev.mode == Mode.FAILED_OVER and moved:
        # Same ranks off their primary, another channel plan (a second rail of a node).
        return failover(p, base, moved, note=None)
    return Reconciled(desired, None, conn, p.warnings)


def _measured_k_again(s: _Found, desired: Desired) -> Reconciled | None:
    """4. While failed over, a steady measured k far enough from the decided one is asked
    the cost question again; only a changed answer (restart now, or nothing to do) is
    a decision. The same failover again is none: k stays the one decided with."""
    p, prev = s.p, s.prev
    job = p.job
    if not (
        prev.mode == Mode.FAILED_OVER
        and job.measured_k is not None
        and prev.k is not None
        and abs(job.measured_k - prev.k) > p.options.measured_k_tolerance * prev.k
    ):
        return None
    note = f"measured k {job.measured_k:.3f} replaces {prev.k:.3f}"
    again = cost_decision(
        p,
        s.base,
        s.moved,
        at=p.now,
        first=None,
        note=note,
        trigger=f"measured_k:{job.measured_k:.4f}",
    )
    same = again.decision is not None and again.decision.action == Action.FAILOVER
    if not (same and again.desired.same_outcome(desired)):
        return again
    return None


def _stranded(conn: Connectivity, prev: Desired, moved: Mapping[int, str]) -> dict[int, str]:
    """Ranks of `prev.moved` whose backup and primary are both failed now."""
    gone = sorted(r for r in prev.moved if r not in moved)
    routes = routes_by_rank(conn, gone)
    return {
        r: prev.moved[r]
        for r in gone
        if r in routes and not routes[r].primary_ok and not routes[r].backup_ok
    }


def _held(
    job: JobState,
    prev: Desired,
    moved: Mapping[int, str],
    fabric: FabricView,
    conn: Connectivity,
    *,
    options: Options,
) -> dict[int, str]:
    """Ranks whose primary is healthy again that must wait on their backup.

    A fail-back is one switch point for every rank of a registered communicator:
    "return to your primary paths, but for these disabled channels". While some member
    stays on its backup (its primary still failed) and the plan disables no channel to
    keep that rail out (one rail, s-Bond only, NVL), such a fail-back would send that
    member back onto its dead primary; so nobody of that communicator returns until all
    can. A job without registered communicators is told rank by rank instead.
    """
    candidates = {r for r in prev.moved if r not in moved}
    if not candidates or not moved or not job.communicators or job.nccl is not None:
        return {}
    disabled = with_mitigations(job, fabric, conn, prev, dict(moved), options=options).disabled
    held: dict[int, str] = {}
    staying = set(moved)
    changed = True
    while changed:  # a held rank stays on its backup, so its other communicators wait too
        changed = False
        for comm in job.communicators:
            if comm.comm_id == IMPLICIT_COMM or disabled.get(comm.comm_id):
                continue
            members = set(comm.ranks) if comm.ranks else {r for r, _, _ in job.ranks}
            waiting = (candidates & members) - held.keys()
            if waiting and staying & members:
                for r in waiting:
                    held[r] = prev.moved[r]
                staying |= waiting
                changed = True
    return held
