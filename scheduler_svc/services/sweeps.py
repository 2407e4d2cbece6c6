"""The coordinator loop: deadlines. Overdue commands are retried or failed, faults whose
clearing rule is met by now (damping, quiet period) are closed, maintenance windows whose
lead time, start or end has come are stepped on, and the jobs they touch reconciled.

It runs in every replica. Overdue commands are claimed with SKIP LOCKED on
PostgreSQL, and every reconcile takes the job's row lock, so two replicas
sweeping at once never act twice.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.services import acks, commands, fabric, maintenance, reconciler, retention
from scheduler_svc.services.delivery import CommandNotifier
from scheduler_svc.store.commands import CommandRepo
from scheduler_svc.store.jobs import JobRepo
from scheduler_svc.store.uow import Clock, pending_nodes, unit_of_work

log = logging.getLogger(__name__)


def sweep_once(
    sessions: sessionmaker[Session],
    reads: sessionmaker[Session],
    now: datetime,
    settings: Settings,
) -> set[str]:
    """One pass, each overdue command and the fault clearing in a transaction of its own.

    A transaction per item keeps the write lock (SQLite) and the job locks
    (PostgreSQL) short. Returns the nodes that got commands.
    """
    with reads() as session:
        overdue = [c.command_id for c in CommandRepo(session).overdue_commands(now)]
        due = fabric.has_cleared(session, now, settings)
        retry = JobRepo(session).due_for_reconcile(now)
        windows = maintenance.due(session, now)
    notify: set[str] = set()
    for command_id in overdue:
        with unit_of_work(sessions) as session:
            retry_overdue_command(session, command_id, now, settings)
            notify |= set(pending_nodes(session))
    for window_id in windows:
        with unit_of_work(sessions) as session:
            maintenance.advance(session, window_id, now, settings)
            notify |= set(pending_nodes(session))
    if retry:
        with unit_of_work(sessions) as session:
            reconciler.reconcile_jobs(session, retry, now, settings)
            notify |= set(pending_nodes(session))
    if due:
        with unit_of_work(sessions) as session:
            closed = fabric.close_cleared(session, now, settings)
            switches = fabric.clear_switches(session, closed, now, settings.correlation_window_s)
            nodes = fabric.nodes_touched(session, closed, switches)
            if nodes:
                reconciler.reconcile_jobs(
                    session, JobRepo(session).job_ids_on_nodes(nodes), now, settings
                )
            notify |= set(pending_nodes(session))
    return notify


def retry_overdue_command(
    session: Session, command_id: int, now: datetime, settings: Settings
) -> None:
    """Re-issue a command nobody acknowledged; after the last attempt, fail it and reconcile."""
    # Its job's lock first, then the command's: the order of every other writer of
    # commands (a reconcile, a re-post, an ack supersede commands under their job's lock).
    # Claiming the command first deadlocked with them on PostgreSQL.
    job_id = CommandRepo(session).job_of(command_id)
    if job_id is None or JobRepo(session).lock(job_id) is None:
        return
    # Claimed again under its lock: another replica may have handled it meanwhile.
    for cmd in CommandRepo(session).overdue_commands(now, command_id=command_id):
        if commands.retry_or_fail(session, cmd, now, settings):
            acks.cannot_move(
                session,
                cmd,
                f"{cmd.kind} command {cmd.command_id} to {cmd.node} was not acknowledged after "
                f"{cmd.attempt} attempts; its ranks cannot be moved",
                now,
                settings,
            )


class Coordinator:
    """Runs `sweep_once` every `coordinator_interval_s` in a thread of its own."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        reads: sessionmaker[Session],
        settings: Settings,
        notifier: CommandNotifier,
        clock: Clock,
    ) -> None:
        self._clock = clock
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

    def sweep(self) -> set[str]:
        """One sweep at the clock's now, its nodes told of their commands; returns them.
        The thread runs it every interval; a caller that owns the clock (the fleet twin,
        with the thread off: RAILOVER_COORDINATOR=false) runs it after each move of it."""
        nodes = sweep_once(self._sessions, self._reads, self._clock(), self._settings)
        if nodes:
            self._notifier.notify_threadsafe(nodes)
        return nodes

    def _run(self) -> None:
        pruned_at = -retention.RETENTION_EVERY_S
        while not self._stop.wait(self._settings.coordinator_interval_s):
            try:
                self.sweep()
            except Exception:  # the loop must outlive any single bad sweep
                metrics.SWEEPS.labels(outcome="error").inc()
                log.exception("coordinator sweep failed; retrying next interval")
            else:
                metrics.SWEEPS.labels(outcome="ok").inc()
            if time.monotonic() - pruned_at >= retention.RETENTION_EVERY_S:
                pruned_at = time.monotonic()
                try:
                    retention.prune(self._sessions, self._clock(), self._settings)
                except Exception:
                    log.exception("retention pass failed; retrying in a minute")
