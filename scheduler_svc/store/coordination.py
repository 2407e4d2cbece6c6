"""Cluster-wide coordination of a job's ranks: its communicators, the ranks' progress in
them (where switch points are placed), and the iteration times it reports."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, delete, select, tuple_
from sqlalchemy.orm import Session, aliased

from scheduler_svc.store import models as m

# Iteration samples a measured k is made of, newest first, per job and side: no more are
# ever read, and retention keeps no more (services/retention.py).
SAMPLES_READ = 50


@dataclass(frozen=True, slots=True)
class ProgressSample:
    """One rank's op count at a moment, placed under its job."""

    job_id: str
    comm_id: int
    rank: int
    ops_done: int
    at: datetime


# A pass's read of the job's communicators, built once (see store/commands.py).
_COMMUNICATORS = (
    select(m.Communicator)
    .where(m.Communicator.job_id == bindparam("job_id"))
    .order_by(m.Communicator.comm_id)
)


class CoordinationRepo:
    """Communicators, the ranks' progress in them, and iteration samples."""

    def __init__(self, session: Session) -> None:
        self.s = session

    # -- communicators ----------------------------------------------------------------------
    def communicators(self, job_id: str) -> Sequence[m.Communicator]:
        return self.s.scalars(_COMMUNICATORS, {"job_id": job_id}).all()

    def jobs_of_comm(self, comm_ids: Iterable[int]) -> dict[int, str]:
        rows = self.s.execute(
            select(m.Communicator.comm_id, m.Communicator.job_id).where(
                m.Communicator.comm_id.in_(list(comm_ids))
            )
        )
        return dict(rows.tuples().all())

    # -- progress -----------------------------------------------------------------------------
    def progress(self, job_id: str, comm_id: int | None = None) -> Sequence[m.RankProgress]:
        q = select(m.RankProgress).where(m.RankProgress.job_id == job_id)
        if comm_id is not None:
            q = q.where(m.RankProgress.comm_id == comm_id)
        return self.s.scalars(q.order_by(m.RankProgress.rank)).all()

    def clear_progress(self, job_id: str) -> None:
        self.s.execute(delete(m.RankProgress).where(m.RankProgress.job_id == job_id))

    def record_progress(self, samples: Sequence[ProgressSample]) -> None:
        """Keep each rank's newest count; its rate comes from the previous sample.

        Reports may reorder: an older or smaller count than the stored one is dropped.
        One read for the whole batch (an agent posts all its ranks at once).
        """
        if not samples:
            return
        keys = {(s.job_id, s.comm_id, s.rank) for s in samples}
        stored = {
            (r.job_id, r.comm_id, r.rank): r
            for r in self.s.scalars(
                select(m.RankProgress).where(
                    tuple_(m.RankProgress.job_id, m.RankProgress.comm_id, m.RankProgress.rank).in_(
                        sorted(keys)
                    )
                )
            )
        }
        for s in samples:
            key = (s.job_id, s.comm_id, s.rank)
            row = stored.get(key)
            if row is None:
                stored[key] = row = m.RankProgress(
                    job_id=s.job_id, comm_id=s.comm_id, rank=s.rank, ops_done=s.ops_done, at=s.at
                )
                self.s.add(row)
                continue
            if s.at <= row.at or s.ops_done < row.ops_done:
                continue
            dt = (s.at - row.at).total_seconds()
            if dt > 0:
                row.rate_ops_per_s = (s.ops_done - row.ops_done) / dt
            row.ops_done, row.at = s.ops_done, s.at

    # -- iteration times ----------------------------------------------------------------------
    def add_samples(self, rows: list[m.IterationSample]) -> None:
        self.s.add_all(rows)
        self.s.flush()

    def bound_samples(self, keep: int = SAMPLES_READ) -> int:
        """Delete each job's iteration samples beyond the newest `keep` of each side
        (normal, degraded): no more are ever read. Returns how many went."""
        s, newer = m.IterationSample, aliased(m.IterationSample)
        cutoff = (
            select(newer.id)
            .where(newer.job_id == s.job_id, newer.degraded == s.degraded)
            .order_by(newer.id.desc())
            .offset(keep)
            .limit(1)
            .scalar_subquery()
        )
        result = self.s.execute(
            delete(s).where(s.id <= cutoff).execution_options(synchronize_session=False)
        )
        return int(getattr(result, "rowcount", 0) or 0)

    def samples(self, job_id: str, degraded: bool, limit: int = SAMPLES_READ) -> list[float]:
        return list(
            self.s.scalars(
                select(m.IterationSample.seconds)
                .where(m.IterationSample.job_id == job_id, m.IterationSample.degraded == degraded)
                .order_by(m.IterationSample.id.desc())
                .limit(limit)
            ).all()
        )

    def clear_samples(self, job_id: str, degraded: bool) -> None:
        self.s.execute(
            delete(m.IterationSample).where(
                m.IterationSample.job_id == job_id, m.IterationSample.degraded == degraded
            )
        )
