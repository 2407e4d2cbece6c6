"""The coordinator loop: overdue commands are retried or failed, recovered ports fail back.

It runs in every replica. Overdue commands are claimed with SKIP LOCKED on
PostgreSQL, and every decision it makes takes the job's row lock and a
unique trigger, so two replicas sweeping at once never act twice.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.engine import coordination as coord
from scheduler_svc.fleet import emit_command_change
from scheduler_svc.notify import CommandNotifier
from scheduler_svc.services import ccl, coordination, redecide
from scheduler_svc.services.decisions import inputs_now, job_view, record_decision
from scheduler_svc.store import models as m
from scheduler_svc.store.repositories import CommandRepo, CoordinationRepo, JobRepo

log = logging.getLogger(__name__)


def sweep_once(
    sessions: sessionmaker[Session],
    reads: sessionmaker[Session],
    now: datetime,
    settings: Settings,
) -> set[str]:
    """One pass: each overdue command and each recovered port in a transaction of its own.

    A transaction per item keeps the write lock (SQLite) and the job locks
    (PostgreSQL) short: a pass over hundreds of recovered ports must not hold
    them while it plans every fail-back. Returns the nodes that got commands.
    """
    with reads() as session:
        repo = CoordinationRepo(session)
        commands = [c.command_id for c in repo.overdue_commands(now)]
        faults = [f.id for f in repo.cleared_unresolved_faults()]
    notify: set[str] = set()
    for command_id in commands:
        with sessions() as session, session.begin():
            retry_overdue_command(session, command_id, now, settings)
            notify |= session.info.get("notify_nodes", set())
    for fault_id in faults:
        with sessions() as session, session.begin():
            fail_back_recovered(session, fault_id, now, settings)
            notify |= session.info.get("notify_nodes", set())
    return notify


def retry_overdue_command(
    session: Session, command_id: int, now: datetime, settings: Settings
) -> None:
    """Re-issue a command nobody acknowledged; after the last attempt, fail it and re-decide."""
    repo = CoordinationRepo(session)
    # Claimed again under its lock: another replica may have handled it meanwhile.
    for cmd in repo.overdue_commands(now, command_id=command_id):
        if cmd.attempt < settings.command_max_attempts:
            cmd.state = "superseded"
            emit_command_change(session, cmd)
            retry = m.Command(
                node=cmd.node,
                job_id=cmd.job_id,
                decision_id=cmd.decision_id,
                kind=cmd.kind,
                epoch=cmd.epoch,
                comm_id=cmd.comm_id,
                ops_done=cmd.ops_done,
                disabled_channels=list(cmd.disabled_channels),
                ranks=list(cmd.ranks),
                created_at=now,
                attempt=cmd.attempt + 1,
                ack_deadline_at=now + timedelta(seconds=settings.command_ack_timeout_s),
            )
            CommandRepo(session).add_all([retry])
            session.info.setdefault("notify_nodes", set()).add(cmd.node)
            metrics.COMMAND_RETRIES.inc()
            continue
        cmd.state, cmd.completed_at = "failed", now
        emit_command_change(session, cmd)
        metrics.COMMANDS_FAILED.labels(kind=cmd.kind).inc()
        log.warning(
            "command %d (%s) to %s unacknowledged after %d attempts",
            cmd.command_id,
            cmd.kind,
            cmd.node,
            cmd.attempt,
        )
        redecide.cannot_move(
            session,
            cmd,
            now,
            settings,
            f"{cmd.kind} command {cmd.command_id} to {cmd.node} was not acknowledged after "
            f"{cmd.attempt} attempts; its ranks cannot be moved",
        )


def fail_back_recovered(session: Session, fault_id: int, now: datetime, settings: Settings) -> None:
    """A port up and quiet for the damping period: move its jobs back at one op count."""
    repo = CoordinationRepo(session)
    jobs = JobRepo(session)
    for fault in repo.cleared_unresolved_faults(fault_id=fault_id):
        port = fault.port or 1
        since = now - timedelta(seconds=settings.flap_window_s)
        health = coord.port_health(
            repo.port_transitions(fault.node, fault.device, port, since),
            now,
            damping_s=settings.failback_damping_s,
            max_flaps=settings.flap_max,
            window_s=settings.flap_window_s,
        )
        if health.state in (coord.PortState.DAMPING, coord.PortState.DOWN):
            continue
        fault.resolved_at = now
        if health.state == coord.PortState.FLAPPING or repo.is_flagged(
            fault.node, fault.device, port
        ):
            continue  # stays on its backup; the operator has been told
        for job_id in sorted(jobs.job_ids_on_node(fault.node)):
            job = jobs.lock(job_id)
            if job is None or job.mode != "failed_over":
                continue
            _fail_back(session, job, fault=fault, health=health, now=now, settings=settings)


def _fail_back(
    session: Session,
    job: m.Job,
    *,
    fault: m.Fault,
    health: coord.PortHealth,
    now: datetime,
    settings: Settings,
) -> None:
    view = job_view(session, job, settings.backup_cap_per_switch)
    key = f"{fault.device}/{fault.port or 1}"
    returning = [
        r for r in view.conn.routes if r.node == fault.node and r.primary == key and r.primary_ok
    ]
    if not returning:
        return
    still_moved = view.conn.failed_over_ranks
    # Stock NCCL (issue 16): fail-back is NCCL's own port recovery; Railover records it only.
    nccl_note = ccl.failback_note(job, f"{fault.node}/{key}")
    plan = {
        "mitigation": "failback",
        "returning": [
            {"rank": r.rank, "node": r.node, "gpu": r.gpu, "to": r.primary} for r in returning
        ],
        "still_failed_over": list(still_moved),
    }
    row = record_decision(
        session,
        job,
        trigger=f"failback:{fault.id}",
        fault=fault,
        action="failback",
        reason=(
            f"fail back: {fault.node}/{key} {health.reason}; "
            f"{len(returning)} rank(s) return to their primary at one op count"
            if nccl_note is None
            else f"fail back: {nccl_note[0]}"
        ),
        inputs=inputs_now(session, job, now, settings),
        costs_s={},
        costs_gpu_s={},
        plan=plan,
        now=now,
    )
    if row is None:
        return
    rank_nodes = {r.rank: r.node for r in view.conn.routes}
    if nccl_note is not None:  # stock NCCL: no switch points
        if nccl_note[1] and not still_moved:
            job.mode, job.failed_over_at, job.measured_k = "normal", None, None
            CoordinationRepo(session).clear_samples(job.job_id, degraded=True)
        return
    for comm in coordination.comms_containing(
        session, job, {r.rank for r in returning}, rank_nodes
    ):
        coordination.issue_switch_point(
            session,
            job,
            comm_id=comm.comm_id,
            ranks=comm.ranks or sorted(rank_nodes),
            rank_nodes=rank_nodes,
            kind="failback",
            disabled_channels=[],
            decision_id=row.decision_id,
            now=now,
            settings=settings,
        )
    if not still_moved:
        job.mode, job.failed_over_at, job.measured_k = "normal", None, None
        CoordinationRepo(session).clear_samples(job.job_id, degraded=True)


class Coordinator:
    """Runs `sweep_once` every `coordinator_interval_s` in a thread of its own."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        reads: sessionmaker[Session],
        settings: Settings,
        notifier: CommandNotifier,
    ) -> None:
        self._sessions = sessions
        self._reads = reads
        self._settings = settings
        self._notifier = notifier
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self._settings.coordinator:
            return
        self._thread = threading.Thread(target=self._run, name="railover-coordinator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._settings.coordinator_interval_s):
            try:
                nodes = sweep_once(self._sessions, self._reads, datetime.now(UTC), self._settings)
                if nodes:
                    self._notifier.notify_threadsafe(nodes)
            except Exception:  # the loop must outlive any single bad sweep
                log.exception("coordinator sweep failed; retrying next interval")
