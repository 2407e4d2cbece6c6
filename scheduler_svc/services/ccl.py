"""Stock NCCL beside Railover: communicators its profiler plugin announced, and stalls.

A job running stock NCCL learns its communicators from the ranks themselves:
every rank of a communicator announces the same comm_id, so the first
announcement registers it under the job, and its progress then lands there.
A stall is evidence about the ranks' node, kept for operators and for later
correlation; it opens no fault on any NIC.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.api.schemas.events import EventIn, EventKind
from scheduler_svc.store import models as m
from scheduler_svc.store.ccl import CclRepo
from scheduler_svc.store.coordination import CoordinationRepo
from scheduler_svc.store.jobs import JobRepo

log = logging.getLogger(__name__)


def _job_for(session: Session, e: EventIn) -> str | None:
    """The job an announcing process belongs to: the one it names, else the node's only job."""
    on_node = JobRepo(session).job_ids_on_node(e.node)
    if e.job_id is not None and e.job_id in on_node:
        return e.job_id
    return on_node[0] if len(on_node) == 1 else None


def register_announced(session: Session, events: list[EventIn]) -> int:
    """Attach announced communicators to their jobs; returns how many were new.

    A communicator over every rank of the job covers all of them (ranks = []).
    A smaller one (a tensor- or pipeline-parallel group) is known only by the
    nodes it was announced from, so it covers the job's ranks on those nodes:
    a superset of its members, which only widens what a mitigation plans for.
    A communicator the fleet manager declared is left as declared.
    """
    announced = [e for e in events if e.kind == EventKind.COMMUNICATOR and e.comm_id]
    if not announced:
        return 0
    repo = CclRepo(session)
    owners = CoordinationRepo(session).jobs_of_comm({e.comm_id for e in announced if e.comm_id})
    new = 0
    for e in announced:
        # EventIn's validator requires both for this kind.
        assert e.comm_id is not None
        assert e.nranks is not None
        job_id = owners.get(e.comm_id) or _job_for(session, e)
        if job_id is None:
            metrics.CCL_ANNOUNCEMENTS.labels(result="unplaced").inc()
            log.info(
                "communicator %d announced on %s fits no single job there; not attached",
                e.comm_id,
                e.node,
            )
            continue
        on_node = repo.ranks_on_node(job_id, e.node)
        comm = repo.communicator(job_id, e.comm_id)
        if comm is None:
            whole = e.nranks >= repo.world_size(job_id)
            row = m.Communicator(
                job_id=job_id,
                comm_id=e.comm_id,
                channels=8,
                ranks=[] if whole else on_node,
                epoch=0,
                disabled_channels=[],
                nranks=e.nranks,
            )
            if repo.add_communicator(row) is not None:
                owners[e.comm_id] = job_id
                new += 1
                metrics.CCL_ANNOUNCEMENTS.labels(result="registered").inc()
                continue
            comm = repo.communicator(job_id, e.comm_id)
        metrics.CCL_ANNOUNCEMENTS.labels(result="known").inc()
        if comm is not None and comm.nranks is not None and comm.ranks:
            merged = sorted(set(comm.ranks) | set(on_node))
            if merged != comm.ranks:
                comm.ranks = merged
    return new


def record_stalls(session: Session, events: list[EventIn]) -> int:
    """Store each reported stall once, under its job when the communicator is known."""
    stalls = [e for e in events if e.kind == EventKind.STALL and e.comm_id]
    if not stalls:
        return 0
    repo = CclRepo(session)
    owners = CoordinationRepo(session).jobs_of_comm({e.comm_id for e in stalls if e.comm_id})
    stored = 0
    for e in stalls:
        assert e.comm_id is not None
        assert e.seq_number is not None
        func = e.detail.get("func")
        open_s = e.detail.get("open_s")
        row = m.CclStall(
            event_id=e.event_id,
            node=e.node,
            comm_id=e.comm_id,
            rank=e.rank,
            seq_number=e.seq_number,
            func=func[:64] if isinstance(func, str) else "",
            open_s=float(open_s) if isinstance(open_s, int | float) and 0 <= open_s < 1e9 else None,
            job_id=owners.get(e.comm_id),
            observed_at=e.observed_at,
        )
        if repo.add_stall(row) is not None:
            stored += 1
            metrics.CCL_STALLS.inc()
            log.warning(
                "%s: collective %s seq %d of comm %d (rank %s) stalled; evidence on the node",
                e.node,
                row.func or "?",
                e.seq_number,
                e.comm_id,
                e.rank,
            )
    return stored


def is_stock_nccl(job: m.Job) -> bool:
    """The job runs stock NCCL: it takes no commands (the profiler plugin reads none)."""
    return job.ccl is not None and job.ccl.get("kind") == "nccl"
