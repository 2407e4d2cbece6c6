"""Jobs: their placement, checkpoints, rebuild failures, reconcile marks and decisions.

Decisions live with their job: each is taken under the job's row lock (JobRepo.lock).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    BindParameter,
    Executable,
    Table,
    bindparam,
    case,
    delete,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m
from scheduler_svc.store import plain
from scheduler_svc.store.idempotency import insert_new, on_conflict_insert
from scheduler_svc.store.types import JobMode

if TYPE_CHECKING:
    import sqlite3

    import psycopg

# The placement table itself, for writes that skip the ORM (JobRepo.add, replace_ranks).
JOB_RANKS = cast("Table", m.JobRank.__table__)
COPY_RANKS = "COPY job_ranks (job_id, rank, node, gpu) FROM STDIN"
INSERT_RANKS = "INSERT INTO job_ranks (job_id, rank, node, gpu) VALUES (?, ?, ?, ?)"


def _mark_due_on_nodes(postgresql: bool) -> Executable:
    """The jobs with ranks on "nodes", each marked due "at" unless already due by then
    (`JobRepo.mark_due_on_nodes`): one statement, returning every such job's id."""
    on_nodes = (
        select(m.JobRank.job_id)
        .where(m.JobRank.node.in_(bindparam("nodes", expanding=True)))
        .distinct()
    )
    sooner = or_(m.Job.reconcile_due_at.is_(None), m.Job.reconcile_due_at > bindparam("at"))
    if not postgresql:
        # SQLite has one writer and no data-modifying WITH: every job on the nodes is
        # written, those due sooner with the time they had, and returned.
        return (
            update(m.Job)
            .where(m.Job.job_id.in_(on_nodes))
            .values(reconcile_due_at=case((sooner, bindparam("at")), else_=m.Job.reconcile_due_at))
            .returning(m.Job.job_id)
        )
    # PostgreSQL: the marks are a data-modifying WITH, which runs whether or not the
    # answer reads it; a row a pass holds locked is skipped, not waited for.
    named = on_nodes.cte("on_nodes")
    unmarked = (
        select(m.Job.job_id)
        .where(m.Job.job_id.in_(select(named.c.job_id)), sooner)
        .with_for_update(skip_locked=True)
    )
    marked = (
        update(m.Job)
        .where(m.Job.job_id.in_(unmarked))
        .values(reconcile_due_at=bindparam("at"))
        .returning(m.Job.job_id)
        .cte("marked")
    )
    return select(named.c.job_id).add_cte(marked)


# The statements of a report's pass and a poll, built once (see store/commands.py).
_JOB: BindParameter[str] = bindparam("job_id")
_LOCK = (
    select(m.Job)
    .where(m.Job.job_id == _JOB)
    .with_for_update()
    .execution_options(populate_existing=True)
)
_RANK_TUPLES = (
    select(m.JobRank.rank, m.JobRank.node, m.JobRank.gpu)
    .where(m.JobRank.job_id == _JOB)
    .order_by(m.JobRank.rank)
)
_RANKS_ON_NODE = select(m.JobRank.job_id, m.JobRank.rank).where(m.JobRank.node == bindparam("node"))
_JOBS_ON_NODES = (
    select(m.JobRank.job_id)
    .where(m.JobRank.node.in_(bindparam("nodes", expanding=True)))
    .distinct()
)
_MARK_DUE_ON_NODES = {False: _mark_due_on_nodes(False), True: _mark_due_on_nodes(True)}
_NEWEST_CHECKPOINT = (
    select(m.Checkpoint)
    .where(
        m.Checkpoint.job_id == _JOB,
        m.Checkpoint.incarnation.is_(None) | (m.Checkpoint.incarnation == bindparam("incarnation")),
    )
    .order_by(m.Checkpoint.received_at.desc(), m.Checkpoint.id.desc())
    .limit(1)
)
_HAS_MIRROR_FAILURES = select(m.MirrorFailure.id).where(m.MirrorFailure.job_id == _JOB).limit(1)
_ADD_DECISION = on_conflict_insert(m.Decision, ("job_id", "trigger"))


class JobRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def get(self, job_id: str) -> m.Job | None:
        return self.s.get(m.Job, job_id)

    def lock(self, job_id: str) -> m.Job | None:
        """Load a job holding its row lock until commit.

        Decisions for one job are serialised on this lock (SELECT ... FOR UPDATE
        on PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises every
        writer), so two replicas handling faults of one job decide one after
        the other and the second sees the first's decision. A row lock rather
        than pg_advisory_xact_lock: the job row is written by the decision
        anyway, the lock ends with the transaction on every path (commit,
        rollback, a dropped connection), and SQLite needs no second mechanism.
        UNIQUE (job_id, trigger) on decisions is the backstop for any path
        that forgets to lock. Events for the outbox are emitted under this lock
        too, which is what makes their ids follow the job's decision order.
        """
        return self.s.scalar(_LOCK, {"job_id": job_id})

    def add(self, job: m.Job, ranks: Sequence[tuple[int, str, int]] = ()) -> None:
        """Store the job and its (rank, node, gpu) placement. The ranks (65,536 for a large
        job) go straight into the table, not as ORM objects: by COPY on PostgreSQL, by one
        executemany of the driver's on SQLite (the ORM's bulk insert took twice as long
        there, and a Core insert still built each row's parameters in Python)."""
        self.s.add(job)
        self.s.flush()
        self._insert_ranks(job.job_id, ranks)

    def replace_ranks(self, job: m.Job, ranks: Sequence[tuple[int, str, int]]) -> None:
        """A new placement for a stored job: the old rows go in one DELETE (not loaded and
        deleted one by one through `job.ranks`), the new ones in as `add` puts them."""
        self.s.execute(delete(JOB_RANKS).where(JOB_RANKS.c.job_id == job.job_id))
        self.s.expire(job, ["ranks"])
        self._insert_ranks(job.job_id, ranks)

    def _insert_ranks(self, job_id: str, ranks: Sequence[tuple[int, str, int]]) -> None:
        if not ranks:
            return
        if self.s.get_bind().dialect.name == "postgresql":
            self._copy_ranks(job_id, ranks)
            return
        raw = cast("sqlite3.Connection", self.s.connection().connection.dbapi_connection)
        raw.executemany(INSERT_RANKS, [(job_id, r, n, g) for r, n, g in ranks])

    def _copy_ranks(self, job_id: str, ranks: Sequence[tuple[int, str, int]]) -> None:
        """PostgreSQL: COPY into job_ranks on the session's own connection, inside its
        transaction; 65,536 rows took 0.85 s by executemany, about a quarter of that so."""
        raw = cast("psycopg.Connection[Any]", self.s.connection().connection.dbapi_connection)
        with raw.cursor() as cur, cur.copy(COPY_RANKS) as copy:
            for r, n, g in ranks:
                copy.write_row((job_id, r, n, g))

    def delete(self, job: m.Job) -> None:
        self.s.delete(job)
        self.s.flush()

    def all(self) -> Sequence[m.Job]:
        return self.s.scalars(select(m.Job).order_by(m.Job.created_at)).all()

    def rank_tuples(self, job_id: str) -> list[tuple[int, str, int]]:
        """(rank, node, gpu) rows without building ORM objects: 1,024 of them per decision."""
        return list(self.s.execute(_RANK_TUPLES, {"job_id": job_id}).tuples().all())

    def rank_counts(self) -> dict[str, tuple[int, list[str]]]:
        """Per job: how many ranks and on which nodes, without loading rank rows."""
        rows = self.s.execute(
            select(m.JobRank.job_id, m.JobRank.node, func.count())
            .group_by(m.JobRank.job_id, m.JobRank.node)
            .order_by(m.JobRank.job_id, m.JobRank.node)
        )
        out: dict[str, tuple[int, list[str]]] = {}
        for job_id, node, n in rows.tuples():
            ranks, nodes = out.get(job_id, (0, []))
            nodes.append(node)
            out[job_id] = (ranks + n, nodes)
        return out

    def job_ids_on_node(self, node: str) -> list[str]:
        return self.job_ids_on_nodes([node])

    def lock_placement(self) -> None:
        """Serialise the checks of which GPUs jobs hold with the writes that place ranks.

        Two jobs posted at once onto the same GPU would each miss the other's uncommitted
        ranks on PostgreSQL (READ COMMITTED); under one transaction advisory lock the
        second sees the first's. SQLite has one writer already.
        """
        if self.s.get_bind().dialect.name == "postgresql":
            plain.execute(
                self.s,
                text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
                {"key": "railover placement"},
                flush=False,
            )

    def gpu_holders(self, nodes: Iterable[str], *, besides: str) -> dict[tuple[str, int], str]:
        """(node, gpu) -> job for the GPUs of these nodes that running jobs other than
        `besides` hold. A restarting job holds none: its processes were told to abort, and
        it is placed again when the fleet manager posts it."""
        rows = self.s.execute(
            select(m.JobRank.node, m.JobRank.gpu, m.JobRank.job_id)
            .join(m.Job, m.Job.job_id == m.JobRank.job_id)
            .where(
                m.JobRank.node.in_(list(nodes)),
                m.JobRank.job_id != besides,
                m.Job.mode != JobMode.RESTARTING.value,
            )
        )
        return {(node, gpu): job for node, gpu, job in rows.tuples()}

    def ranks_on_node(self, node: str) -> dict[str, set[int]]:
        """Each job with ranks on the node, and those ranks' numbers (a few rows: one per GPU)."""
        out: dict[str, set[int]] = {}
        for job_id, rank in plain.execute(self.s, _RANKS_ON_NODE, {"node": node}).tuples():
            out.setdefault(job_id, set()).add(rank)
        return out

    def job_ids_on_nodes(self, nodes: Iterable[str]) -> list[str]:
        return sorted(plain.execute(self.s, _JOBS_ON_NODES, {"nodes": list(nodes)}).scalars())

    def due_for_reconcile(self, now: datetime, limit: int = 100) -> list[str]:
        """Jobs the coordinator must reconcile by `now` (a pass failed, or a report's
        own pass never ran), the longest due first."""
        return list(
            self.s.scalars(
                select(m.Job.job_id)
                .where(m.Job.reconcile_due_at <= now)
                .order_by(m.Job.reconcile_due_at)
                .limit(limit)
            ).all()
        )

    def mark_due_on_nodes(self, nodes: Collection[str], at: datetime) -> list[str]:
        """The jobs with ranks on these nodes, in order, in one statement; each is marked
        for the coordinator to reconcile at `at` unless a pass does first.

        Only jobs not already due by then are marked (an earlier mark, or a failed
        pass, keeps its time; a later one, a refused fail-back's retry, gives way). On
        PostgreSQL a job whose row a pass holds locked is named but not marked, rather
        than waited for: the pass, or the next one the caller asks for, covers it, and a
        report must not queue behind a whole-job pass to record its evidence.
        """
        if not nodes:
            return []
        postgresql = self.s.get_bind().dialect.name == "postgresql"
        asked = {"nodes": sorted(nodes), "at": at}
        return sorted(plain.execute(self.s, _MARK_DUE_ON_NODES[postgresql], asked).scalars())

    def nodes_of(self, job_id: str) -> list[str]:
        return sorted(
            self.s.scalars(
                select(m.JobRank.node).where(m.JobRank.job_id == job_id).distinct()
            ).all()
        )

    def newest_checkpoint(self, job_id: str, incarnation: int) -> m.Checkpoint | None:
        """The newest checkpoint reported by `incarnation` (or not naming one, from before
        incarnations were stored)."""
        return self.s.scalar(_NEWEST_CHECKPOINT, {"job_id": job_id, "incarnation": incarnation})

    def add_checkpoint(self, cp: m.Checkpoint) -> None:
        self.s.add(cp)
        self.s.flush()

    def highest_checkpoint_iteration(self, job_id: str, kind: str) -> int | None:
        return self.s.scalar(
            select(func.max(m.Checkpoint.iteration)).where(
                m.Checkpoint.job_id == job_id, m.Checkpoint.kind == kind
            )
        )

    def newest_unnumbered_checkpoint_at(self, job_id: str, kind: str) -> datetime | None:
        return self.s.scalar(
            select(func.max(m.Checkpoint.at)).where(
                m.Checkpoint.job_id == job_id,
                m.Checkpoint.kind == kind,
                m.Checkpoint.iteration.is_(None),
            )
        )

    def checkpoint_below(self, job_id: str, iteration: int) -> m.Checkpoint | None:
        """The newest checkpoint of an iteration below `iteration` (the last one rebuilt)."""
        return self.s.scalar(
            select(m.Checkpoint)
            .where(m.Checkpoint.job_id == job_id, m.Checkpoint.iteration < iteration)
            .order_by(m.Checkpoint.iteration.desc(), m.Checkpoint.at.desc())
            .limit(1)
        )

    def mirror_failure(self, job_id: str, iteration: int) -> m.MirrorFailure | None:
        return self.s.scalar(
            select(m.MirrorFailure).where(
                m.MirrorFailure.job_id == job_id, m.MirrorFailure.iteration == iteration
            )
        )

    def has_mirror_failures(self, job_id: str) -> bool:
        return plain.execute(self.s, _HAS_MIRROR_FAILURES, {"job_id": job_id}).first() is not None

    def clear_mirror_failures(self, job_id: str) -> None:
        self.s.execute(delete(m.MirrorFailure).where(m.MirrorFailure.job_id == job_id))

    def add_mirror_failure(self, row: m.MirrorFailure) -> None:
        self.s.add(row)
        self.s.flush()

    def mirror_failures_from(
        self, job_id: str, iteration: int | None, limit: int = 64
    ) -> list[m.MirrorFailure]:
        """The job's rebuild failures at `iteration` or later (all when None), newest last.

        Failures below the highest checkpointed iteration are answered and never read;
        the rest are few (a failure stops the rebuilds until the next checkpoint).
        """
        q = select(m.MirrorFailure).where(m.MirrorFailure.job_id == job_id)
        if iteration is not None:
            q = q.where(m.MirrorFailure.iteration >= iteration)
        rows = self.s.scalars(q.order_by(m.MirrorFailure.iteration.desc()).limit(limit))
        return sorted(rows, key=lambda f: f.iteration)

    def job_of_rank_on_node(self, node: str, rank: int) -> list[str]:
        return list(
            self.s.scalars(
                select(m.JobRank.job_id).where(m.JobRank.node == node, m.JobRank.rank == rank)
            ).all()
        )

    def incarnations(self, job_ids: Iterable[str]) -> dict[str, tuple[int, datetime | None]]:
        """Each job's current incarnation and when it started."""
        rows = self.s.execute(
            select(m.Job.job_id, m.Job.incarnation, m.Job.incarnation_started_at).where(
                m.Job.job_id.in_(sorted(set(job_ids)))
            )
        )
        return {j: (n, at) for j, n, at in rows.tuples()}


class DecisionRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def get(self, decision_id: str) -> m.Decision | None:
        return self.s.get(m.Decision, decision_id)

    def add(self, d: m.Decision) -> m.Decision | None:
        """Store a decision (a new object); None when this (job, trigger) was already
        decided. One INSERT whether or not it was."""
        return insert_new(self.s, _ADD_DECISION, d)

    def for_job(self, job_id: str, limit: int = 100) -> Sequence[m.Decision]:
        return self.s.scalars(
            select(m.Decision)
            .where(m.Decision.job_id == job_id)
            .order_by(m.Decision.seq.desc())
            .limit(limit)
        ).all()

    def latest_per_job(self, action: str | None = None) -> dict[str, m.Decision]:
        """Each job's newest decision (of ``action``, when given), in one query."""
        newest = select(m.Decision.job_id, func.max(m.Decision.seq).label("seq"))
        if action is not None:
            newest = newest.where(m.Decision.action == action)
        sub = newest.group_by(m.Decision.job_id).subquery()
        rows = self.s.scalars(
            select(m.Decision).join(
                sub, (m.Decision.job_id == sub.c.job_id) & (m.Decision.seq == sub.c.seq)
            )
        ).all()
        return {d.job_id: d for d in rows}

    def actions_and_saved(self) -> list[tuple[str, float]]:
        """(action, saved_gpu_s) of every decision, without loading the rest of each row."""
        rows = self.s.execute(select(m.Decision.action, m.Decision.saved_gpu_s))
        return list(rows.tuples().all())
