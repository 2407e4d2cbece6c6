"""Communicators a CCL announced and the stalls it reported (stock NCCL, issue 16)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m
from scheduler_svc.store.idempotency import insert_unless_taken


class CclRepo:
    """Communicators a CCL announced and the stalls it reported (stock NCCL, issue 16)."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def ranks_on_node(self, job_id: str, node: str) -> list[int]:
        return list(
            self.s.scalars(
                select(m.JobRank.rank)
                .where(m.JobRank.job_id == job_id, m.JobRank.node == node)
                .order_by(m.JobRank.rank)
            ).all()
        )

    def world_size(self, job_id: str) -> int:
        return int(self.s.scalar(select(func.count()).where(m.JobRank.job_id == job_id)) or 0)

    def communicator(self, job_id: str, comm_id: int) -> m.Communicator | None:
        return self.s.get(m.Communicator, (job_id, comm_id))

    def add_communicator(self, row: m.Communicator) -> m.Communicator | None:
        """None when another request announced or declared it first."""
        return insert_unless_taken(self.s, row)

    def add_stall(self, row: m.CclStall) -> m.CclStall | None:
        """None when this collective's stall is already on record."""
        return insert_unless_taken(self.s, row)

    def stalls(self, comm_ids: Iterable[int], limit: int = 100) -> Sequence[m.CclStall]:
        ids = list(comm_ids)
        if not ids:
            return []
        return self.s.scalars(
            select(m.CclStall)
            .where(m.CclStall.comm_id.in_(ids))
            .order_by(m.CclStall.observed_at.desc(), m.CclStall.id.desc())
            .limit(limit)
        ).all()
