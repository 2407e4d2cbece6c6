"""Reconcile passes shared by the requests of a storm: one pass per job covers every
batch whose evidence committed before it began.

When a leaf switch fails, every node under it reports within the same second, and
each report touches the same job. Reconciling the job once per report would run
its whole-job work 64 times in a row, each pass waiting for the one before on the
job's row lock (SQLite: the one writer), and the last agent would wait for all of
them. But a pass reads all the evidence committed before it started, so one pass
that starts after a report's commit answers for that report, and for every other
report committed by then.

So a report commits its evidence first (which also marks its jobs due: if this
process dies before the pass, the coordinator's sweep reconciles them), then asks
for a pass of each job it touched that starts after its commit. If one is running
it waits for it to end, then for the next; the first waiter to find no pass
running starts the next one itself and runs it in its own thread and transaction.
The passes of one job run one at a time in this process; across replicas the
job's row lock still orders them, and the second finds what the first did.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from sqlalchemy.orm import Session, sessionmaker

from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.services import reconciler
from scheduler_svc.store.uow import Clock, Notify, unit_of_work


class Decided(NamedTuple):
    """One decision a pass stored: its id, and its action (for the latency histogram)."""

    decision_id: str
    action: str


@dataclass
class _Job:
    started: int = 0  # passes begun
    done: int = 0  # passes ended (run or failed)
    decided: dict[int, list[Decided]] = field(default_factory=dict)  # pass -> its decisions
    readers: dict[int, int] = field(default_factory=dict)  # pass -> callers yet to read it
    waiting: int = 0  # callers in _covered, the one running a pass among them

    @property
    def running(self) -> bool:
        return self.started > self.done  # one pass at a time: begun and not yet ended


class ReconcilePasses:
    """Single flight per job: concurrent reports share the passes that cover them."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        settings: Settings,
        clock: Clock,
        notify: Notify | None = None,
    ) -> None:
        self._factory = factory
        self._settings = settings
        self._clock = clock
        self._notify = notify
        self._cond = threading.Condition()
        self._jobs: dict[str, _Job] = {}

    def reconcile(self, job_ids: Iterable[str]) -> list[Decided]:
        """The decisions of the passes that covered this caller's committed evidence.

        Call only after the caller's evidence has committed. Jobs in sorted order,
        as everywhere. A pass that found nothing new to decide (an earlier one did,
        with this evidence) contributes none.
        """
        decided: list[Decided] = []
        for job_id in sorted(set(job_ids)):
            decided += self._covered(job_id)
        return decided

    def waiting(self, job_id: str) -> int:
        """Callers waiting for (or running) a pass of this job now."""
        with self._cond:
            job = self._jobs.get(job_id)
            return 0 if job is None else job.waiting

    def held(self, job_id: str) -> int:
        """Passes of this job whose decision ids are kept for callers yet to read them."""
        with self._cond:
            job = self._jobs.get(job_id)
            return 0 if job is None else len(job.decided)

    def _covered(self, job_id: str) -> list[Decided]:
        metrics.REPORTS_RECONCILED.inc()
        with self._cond:
            job = self._jobs.setdefault(job_id, _Job())
            # A pass running now may have read the store before this caller's commit;
            # the next one to start cannot have.
            need = job.started + 1
            job.waiting += 1
            job.readers[need] = job.readers.get(need, 0) + 1
            try:
                while job.done < need:
                    if job.running:
                        self._cond.wait()
                        continue
                    job.started += 1
                    mine = job.started
                    ids: list[Decided] = []
                    self._cond.release()
                    try:
                        ids = self._run(job_id)
                    finally:
                        self._cond.acquire()
                        job.done = mine
                        job.decided[mine] = ids
                        self._cond.notify_all()
                return job.decided.get(need, [])
            finally:
                # A pass's ids are kept until its last reader has them, so an unbroken
                # storm keeps only the passes still awaited, not every one it ran.
                job.readers[need] -= 1
                if job.readers[need] == 0:
                    del job.readers[need]
                    job.decided.pop(need, None)
                job.waiting -= 1
                if job.waiting == 0:
                    # Nobody left to read them (a runner is a caller too): forget the job.
                    del self._jobs[job_id]

    def _run(self, job_id: str) -> list[Decided]:
        """One pass of one job in a transaction of its own; its decisions."""
        metrics.REPORT_PASSES.inc()
        now: datetime = self._clock()
        with unit_of_work(self._factory, self._notify) as session:
            rows = reconciler.reconcile_jobs(session, [job_id], now, self._settings)
            return [Decided(r.decision_id, r.action) for r in rows]
