"""Every query the service makes lives here. Repositories flush at most; the request commits."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import Select, Table, delete, func, insert, or_, select, text, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m

if TYPE_CHECKING:
    import psycopg

_Row = TypeVar("_Row", bound=m.Base)

TOKEN_PREFIX = "rvr"  # noqa: S105  (a public prefix, not a secret)
# The placement table itself, for inserts that skip the ORM (JobRepo.add).
JOB_RANKS = cast("Table", m.JobRank.__table__)
COPY_RANKS = "COPY job_ranks (job_id, rank, node, gpu) FROM STDIN"


def _insert_unless_taken(session: Session, row: _Row) -> _Row | None:
    """Insert a row, or return None when a unique key says it is already there.

    A savepoint keeps the rest of the transaction: this is how a replayed event,
    a second replica or a racing request finds a fault, decision, switch fault
    or flag that exists, without deciding or flagging twice.
    """
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        return None
    return row


def hash_secret(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class NodeLook:
    pending: bool  # commands wait for the node
    unreachable: bool  # an UNREACHABLE fault on the node is open


@dataclass(frozen=True, slots=True)
class ProgressSample:
    """One rank's op count at a moment, placed under its job."""

    job_id: str
    comm_id: int
    rank: int
    ops_done: int
    at: datetime


class TokenRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def create(
        self,
        *,
        role: str,
        node: str | None,
        description: str,
        now: datetime,
        expires_at: datetime | None = None,
    ) -> tuple[m.ApiToken, str]:
        """Store a new token; the plain text is returned once and never stored."""
        token_id = secrets.token_hex(6)
        plain = f"{TOKEN_PREFIX}_{token_id}_{secrets.token_urlsafe(32)}"
        row = m.ApiToken(
            token_id=token_id,
            secret_sha256=hash_secret(plain),
            role=role,
            node=node,
            description=description,
            created_at=now,
            expires_at=expires_at,
        )
        self.s.add(row)
        self.s.flush()
        return row, plain

    def by_plain(self, plain: str, now: datetime) -> m.ApiToken | None:
        """The token with this secret, unless it is revoked or expired."""
        return self.s.scalar(
            select(m.ApiToken).where(m.ApiToken.secret_sha256 == hash_secret(plain), *_usable(now))
        )

    def count_active(self, now: datetime) -> int:
        """Tokens that still work: any at all closes anonymous access."""
        return self.s.scalar(select(func.count()).select_from(m.ApiToken).where(*_usable(now))) or 0

    def any_active(self, now: datetime) -> bool:
        """Cheaper than a count: asked on every anonymous request."""
        return self.s.scalar(select(m.ApiToken.token_id).where(*_usable(now)).limit(1)) is not None

    def all(self) -> Sequence[m.ApiToken]:
        return self.s.scalars(select(m.ApiToken).order_by(m.ApiToken.created_at)).all()

    def revoke(self, token_id: str, now: datetime) -> bool:
        res = self.s.execute(
            update(m.ApiToken)
            .where(m.ApiToken.token_id == token_id, m.ApiToken.revoked_at.is_(None))
            .values(revoked_at=now)
        )
        return bool(getattr(res, "rowcount", 0))


def _usable(now: datetime) -> tuple[Any, ...]:
    return (
        m.ApiToken.revoked_at.is_(None),
        or_(m.ApiToken.expires_at.is_(None), m.ApiToken.expires_at > now),
    )


class NodeRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def get(self, name: str) -> m.Node | None:
        return self.s.get(m.Node, name)

    def get_many(self, names: Iterable[str]) -> dict[str, m.Node]:
        rows = self.s.scalars(select(m.Node).where(m.Node.name.in_(list(names)))).all()
        return {n.name: n for n in rows}

    def gpu_indexes(self, names: Iterable[str]) -> dict[str, set[int]]:
        """Each registered node's GPU indexes (a node with none maps to an empty set), as
        plain rows: a 65,536-rank job names 8,192 nodes."""
        wanted = list(names)
        out: dict[str, set[int]] = {
            n: set() for n in self.s.scalars(select(m.Node.name).where(m.Node.name.in_(wanted)))
        }
        rows = self.s.execute(select(m.Gpu.node, m.Gpu.index).where(m.Gpu.node.in_(wanted)))
        for node, index in rows:
            out[node].add(index)
        return out

    def all(self) -> Sequence[m.Node]:
        return self.s.scalars(select(m.Node).order_by(m.Node.name)).all()

    def fleet_stamp(self) -> tuple[int, int, int, datetime | None]:
        """Nodes, the sum and highest of their topology versions, and the newest registration:
        one aggregate row that changes when any node registers anew or changes topology.
        A cached job index is checked node by node (`versions`) only when it changed."""
        row = self.s.execute(
            select(
                func.count(),
                func.coalesce(func.sum(m.Node.topology_version), 0),
                func.coalesce(func.max(m.Node.topology_version), 0),
                func.max(m.Node.registered_at),
            )
        ).one()
        return int(row[0]), int(row[1]), int(row[2]), row[3]

    def versions(self, names: Iterable[str]) -> dict[str, tuple[int, datetime]]:
        """(topology version, registration time) per node: a cheap read that tells whether
        cached plans still hold. The time tells a node re-created in a fresh store (whose
        versions start again at 1) from the one a cache saw before."""
        rows = self.s.execute(
            select(m.Node.name, m.Node.topology_version, m.Node.registered_at).where(
                m.Node.name.in_(list(names))
            )
        )
        return {name: (version, at) for name, version, at in rows.tuples()}

    def replace_topology(
        self,
        name: str,
        gpus: list[dict[str, Any]],
        rnics: list[dict[str, Any]],
        now: datetime,
    ) -> tuple[m.Node, bool]:
        """Create or replace a node's topology; returns (node, changed)."""
        node = self.get(name)
        if node is None:
            node = m.Node(name=name, registered_at=now, updated_at=now, topology_version=1)
            node.gpus = [m.Gpu(node=name, **g) for g in gpus]
            node.rnics = [m.Rnic(node=name, **r) for r in rnics]
            self.s.add(node)
            self.s.flush()
            return node, True
        changed = _shape(node.gpus, GPU_FIELDS) != _shape(gpus, GPU_FIELDS) or _shape(
            node.rnics, RNIC_FIELDS
        ) != _shape(rnics, RNIC_FIELDS)
        node.updated_at = now
        if changed:
            node.gpus.clear()
            node.rnics.clear()
            self.s.flush()  # delete the old rows before their unique keys come back
            node.gpus.extend(m.Gpu(node=name, **g) for g in gpus)
            node.rnics.extend(m.Rnic(node=name, **r) for r in rnics)
            node.topology_version += 1
        self.s.flush()
        return node, changed

    def observe_port(
        self, node: str, device: str, port: int | None, state: str, at: datetime
    ) -> bool:
        """Record a port's state observed at `at` (every port of the RNIC when `port` is
        None or 0), unless a newer observation is known: the port's level.

        Returns whether it became the level of some port. Of two reports observed at the
        same time, the later one stands (an agent sends a port's reports in order).
        """
        stmt = update(m.Rnic).where(m.Rnic.node == node, m.Rnic.name == device)
        if port:
            stmt = stmt.where(m.Rnic.port == port)
        stmt = stmt.where(m.Rnic.observed_at.is_(None) | (m.Rnic.observed_at <= at))
        result = self.s.execute(stmt.values(state=state, observed_at=at))
        return bool(getattr(result, "rowcount", 0))


# The port states a report can set (sysfs also says INIT, ARMED, ...: not ACTIVE either).
DOWN = "DOWN"
ACTIVE = "ACTIVE"

GPU_FIELDS = ("index", "pci", "numa", "pcie_switch", "root_complex", "nvlink")
RNIC_FIELDS = (
    "name",
    "port",
    "pci",
    "numa",
    "pcie_switch",
    "root_complex",
    "rate_gbps",
    "link_layer",
    "netdev",
    "switch",
    "rail",
    "state",
)


def _shape(rows: Iterable[Any], fields: Sequence[str]) -> list[tuple[Any, ...]]:
    """Rows (models or dicts) as comparable tuples, to tell a real topology change."""

    def get(row: Any, f: str) -> Any:
        return row.get(f) if isinstance(row, dict) else getattr(row, f)

    return sorted(tuple(str(get(r, f)) for f in fields) for r in rows)


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
        return self.s.scalar(
            select(m.Job)
            .where(m.Job.job_id == job_id)
            .with_for_update()
            .execution_options(populate_existing=True)
        )

    def add(self, job: m.Job, ranks: Sequence[tuple[int, str, int]] = ()) -> None:
        """Store the job and its (rank, node, gpu) placement. The ranks (65,536 for a large
        job) go straight into the table, not as ORM objects: by COPY on PostgreSQL, by one
        executemany on SQLite (the ORM's bulk insert took twice as long there)."""
        self.s.add(job)
        self.s.flush()
        if not ranks:
            return
        if self.s.get_bind().dialect.name == "postgresql":
            self._copy_ranks(job.job_id, ranks)
            return
        rows = [{"job_id": job.job_id, "rank": r, "node": n, "gpu": g} for r, n, g in ranks]
        self.s.execute(insert(JOB_RANKS), rows)

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
        rows = self.s.execute(
            select(m.JobRank.rank, m.JobRank.node, m.JobRank.gpu)
            .where(m.JobRank.job_id == job_id)
            .order_by(m.JobRank.rank)
        )
        return list(rows.tuples().all())

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
            self.s.execute(
                text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
                {"key": "railover placement"},
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
                m.Job.mode != m.JobMode.RESTARTING.value,
            )
        )
        return {(node, gpu): job for node, gpu, job in rows.tuples()}

    def ranks_on_node(self, node: str) -> dict[str, set[int]]:
        """Each job with ranks on the node, and those ranks' numbers (a few rows: one per GPU)."""
        out: dict[str, set[int]] = {}
        rows = self.s.execute(
            select(m.JobRank.job_id, m.JobRank.rank).where(m.JobRank.node == node)
        )
        for job_id, rank in rows.tuples():
            out.setdefault(job_id, set()).add(rank)
        return out

    def job_ids_on_nodes(self, nodes: Iterable[str]) -> list[str]:
        return sorted(
            self.s.scalars(
                select(m.JobRank.job_id).where(m.JobRank.node.in_(list(nodes))).distinct()
            ).all()
        )

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

    def mark_due(self, job_ids: Sequence[str], at: datetime) -> None:
        """Have the coordinator reconcile these jobs at `at` unless a pass does first.

        Only jobs not already due by then (an earlier mark, or a failed pass, keeps
        its time; a later one, a refused fail-back's retry, gives way). On PostgreSQL a
        job whose row a pass holds locked is skipped rather than waited for: the pass,
        or the next one the caller asks for, covers it, and a report must not queue
        behind a whole-job pass to record its evidence.
        """
        if not job_ids:
            return
        unmarked = select(m.Job.job_id).where(
            m.Job.job_id.in_(list(job_ids)),
            or_(m.Job.reconcile_due_at.is_(None), m.Job.reconcile_due_at > at),
        )
        if self.s.get_bind().dialect.name == "postgresql":
            unmarked = unmarked.with_for_update(skip_locked=True)
        self.s.execute(
            update(m.Job)
            .where(m.Job.job_id.in_(unmarked))
            .values(reconcile_due_at=at)
            .execution_options(synchronize_session=False)
        )

    def nodes_of(self, job_id: str) -> list[str]:
        return sorted(
            self.s.scalars(
                select(m.JobRank.node).where(m.JobRank.job_id == job_id).distinct()
            ).all()
        )

    def newest_checkpoint(self, job_id: str, incarnation: int) -> m.Checkpoint | None:
        """The newest checkpoint reported by `incarnation` (or not naming one, from before
        incarnations were stored)."""
        return self.s.scalar(
            select(m.Checkpoint)
            .where(
                m.Checkpoint.job_id == job_id,
                m.Checkpoint.incarnation.is_(None) | (m.Checkpoint.incarnation == incarnation),
            )
            .order_by(m.Checkpoint.received_at.desc(), m.Checkpoint.id.desc())
            .limit(1)
        )

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
        found = self.s.scalar(
            select(m.MirrorFailure.id).where(m.MirrorFailure.job_id == job_id).limit(1)
        )
        return found is not None

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


class EventRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def insert_new(self, rows: list[dict[str, Any]]) -> set[str]:
        """Insert events whose id is unseen; returns the ids actually inserted.

        ON CONFLICT DO NOTHING makes a replayed batch, or the same batch sent to
        two replicas at once, a no-op for the events already stored.
        """
        if not rows:
            return set()
        dialect = self.s.get_bind().dialect.name
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        stmt = (
            insert(m.Event)
            .values(rows)
            .on_conflict_do_nothing(index_elements=["event_id"])
            .returning(m.Event.event_id)
        )
        return set(self.s.scalars(stmt).all())

    def set_fault(self, event_ids: Iterable[str], fault_id: int) -> None:
        self.s.execute(
            update(m.Event).where(m.Event.event_id.in_(list(event_ids))).values(fault_id=fault_id)
        )

    def count(self, node: str | None = None) -> int:
        q = select(func.count()).select_from(m.Event)
        if node is not None:
            q = q.where(m.Event.node == node)
        return self.s.scalar(q) or 0


def _open_unreachable(node: str) -> Select[tuple[m.Fault]]:
    return select(m.Fault).where(
        m.Fault.node == node,
        m.Fault.device == m.UNREACHABLE_DEVICE,
        m.Fault.port == m.WHOLE_DEVICE_PORT,
        m.Fault.cleared_at.is_(None),
        m.Fault.kind == m.FaultKind.UNREACHABLE.value,
    )


class FaultRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def get(self, fault_id: int) -> m.Fault | None:
        return self.s.get(m.Fault, fault_id)

    def open_if_new(self, fault: m.Fault) -> m.Fault | None:
        """Open a fault unless one is already open on that component (then None)."""
        return _insert_unless_taken(self.s, fault)

    def open_on_component(self, node: str, device: str, port: int) -> m.Fault | None:
        return self.s.scalar(
            select(m.Fault).where(
                m.Fault.node == node,
                m.Fault.device == device,
                m.Fault.port == port,
                m.Fault.cleared_at.is_(None),
            )
        )

    def clear(
        self, node: str, device: str, port: int, now: datetime, kinds: Sequence[str]
    ) -> list[m.Fault]:
        """The port is up again: faults of `kinds` on it (or its whole RNIC) start clearing."""
        rows = self.s.scalars(
            select(m.Fault).where(
                m.Fault.node == node,
                m.Fault.device == device,
                m.Fault.port.in_([port, 0]),
                m.Fault.kind.in_(list(kinds)),
                m.Fault.cleared_at.is_(None),
            )
        ).all()
        for f in rows:
            f.cleared_at = now
        self.s.flush()
        return list(rows)

    def open_unreachable(self, node: str) -> Sequence[m.Fault]:
        """The node's UNREACHABLE fault, if open (the open-component index finds it)."""
        return self.s.scalars(_open_unreachable(node)).all()

    def unresolved(self, nodes: Iterable[str] | None = None) -> Sequence[m.Fault]:
        """Faults that are still evidence: not closed by their clearing rule or an operator."""
        q = select(m.Fault).where(m.Fault.resolved_at.is_(None)).order_by(m.Fault.id)
        if nodes is not None:
            q = q.where(m.Fault.node.in_(list(nodes)))
        return self.s.scalars(q).all()

    def listing(
        self, *, open_only: bool, node: str | None, nodes: Iterable[str] | None, limit: int
    ) -> Sequence[m.Fault]:
        q = select(m.Fault).order_by(m.Fault.id.desc()).limit(limit)
        if open_only:
            q = q.where(m.Fault.resolved_at.is_(None))
        if node is not None:
            q = q.where(m.Fault.node == node)
        if nodes is not None:
            q = q.where(m.Fault.node.in_(list(nodes)))
        return self.s.scalars(q).all()

    def all(self, open_only: bool = True, limit: int = 500) -> Sequence[m.Fault]:
        return self.listing(open_only=open_only, node=None, nodes=None, limit=limit)

    def close(self, fault: m.Fault, now: datetime, reason: str, by: str | None) -> None:
        fault.resolved_at = now
        fault.resolved_reason = reason
        fault.resolved_by = by
        if fault.cleared_at is None:
            fault.cleared_at = now


class DecisionRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def get(self, decision_id: str) -> m.Decision | None:
        return self.s.get(m.Decision, decision_id)

    def add(self, d: m.Decision) -> m.Decision | None:
        """Store a decision; None when this (job, trigger) was already decided."""
        return _insert_unless_taken(self.s, d)

    def exists(self, job_id: str, trigger: str) -> bool:
        return (
            self.s.scalar(
                select(m.Decision.decision_id).where(
                    m.Decision.job_id == job_id, m.Decision.trigger == trigger
                )
            )
            is not None
        )

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


class CommandRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def add_all(self, commands: list[m.Command]) -> None:
        self.s.add_all(commands)
        self.s.flush()

    def get(self, command_id: int) -> m.Command | None:
        return self.s.get(m.Command, command_id)

    def job_of(self, command_id: int) -> str | None:
        """The job a command is for (a plain read: nothing is locked or loaded)."""
        return self.s.scalar(select(m.Command.job_id).where(m.Command.command_id == command_id))

    def pending_for_node(self, node: str, include_delivered: bool = True) -> Sequence[m.Command]:
        """Commands for the node not acknowledged yet (issued, and delivered if asked)."""
        states = ["issued", "delivered"] if include_delivered else ["issued"]
        return self.s.scalars(
            select(m.Command)
            .where(m.Command.node == node, m.Command.state.in_(states))
            .order_by(m.Command.command_id)
        ).all()

    def for_job(self, job_id: str) -> Sequence[m.Command]:
        return self.s.scalars(
            select(m.Command).where(m.Command.job_id == job_id).order_by(m.Command.command_id)
        ).all()

    def has_pending(self, node: str, include_delivered: bool) -> bool:
        states = ["issued", "delivered"] if include_delivered else ["issued"]
        return (
            self.s.scalar(
                select(m.Command.command_id)
                .where(m.Command.node == node, m.Command.state.in_(states))
                .limit(1)
            )
            is not None
        )

    def look(self, node: str, include_delivered: bool) -> NodeLook:
        """What a poll of the node looks for, in one round trip: commands to hand it (as
        `has_pending`), and whether the node is held unreachable (FaultRepo.open_unreachable)."""
        states = ["issued", "delivered"] if include_delivered else ["issued"]
        pending = select(m.Command.command_id).where(
            m.Command.node == node, m.Command.state.in_(states)
        )
        row = self.s.execute(select(pending.exists(), _open_unreachable(node).exists())).one()
        return NodeLook(pending=bool(row[0]), unreachable=bool(row[1]))

    def add_acks(self, acks: Iterable[m.CommandAck]) -> None:
        self.s.add_all(acks)
        self.s.flush()

    def acks(self, command_id: int) -> Sequence[m.CommandAck]:
        return self.s.scalars(
            select(m.CommandAck).where(m.CommandAck.command_id == command_id)
        ).all()

    def unacknowledged(self) -> tuple[dict[str, int], datetime | None]:
        """Commands still waiting for an ack (issued, delivered) per state, and the oldest one."""
        waiting = m.Command.state.in_(["issued", "delivered"])
        counts = self.s.execute(
            select(m.Command.state, func.count()).where(waiting).group_by(m.Command.state)
        )
        oldest = self.s.scalar(select(func.min(m.Command.created_at)).where(waiting))
        return dict(counts.tuples().all()), oldest


class CoordinationRepo:
    """Communicators, progress, iteration samples, switch faults and maintenance flags."""

    def __init__(self, session: Session) -> None:
        self.s = session

    # -- communicators ----------------------------------------------------------------------
    def communicators(self, job_id: str) -> Sequence[m.Communicator]:
        return self.s.scalars(
            select(m.Communicator)
            .where(m.Communicator.job_id == job_id)
            .order_by(m.Communicator.comm_id)
        ).all()

    def jobs_of_comm(self, comm_ids: Iterable[int]) -> dict[int, str]:
        rows = self.s.execute(
            select(m.Communicator.comm_id, m.Communicator.job_id).where(
                m.Communicator.comm_id.in_(list(comm_ids))
            )
        )
        return dict(rows.tuples().all())

    def job_of_rank_on_node(self, node: str, rank: int) -> list[str]:
        return list(
            self.s.scalars(
                select(m.JobRank.job_id).where(m.JobRank.node == node, m.JobRank.rank == rank)
            ).all()
        )

    # -- progress -----------------------------------------------------------------------------
    def progress(self, job_id: str, comm_id: int | None = None) -> Sequence[m.RankProgress]:
        q = select(m.RankProgress).where(m.RankProgress.job_id == job_id)
        if comm_id is not None:
            q = q.where(m.RankProgress.comm_id == comm_id)
        return self.s.scalars(q.order_by(m.RankProgress.rank)).all()

    def clear_progress(self, job_id: str) -> None:
        self.s.execute(delete(m.RankProgress).where(m.RankProgress.job_id == job_id))

    def incarnations(self, job_ids: Iterable[str]) -> dict[str, tuple[int, datetime | None]]:
        """Each job's current incarnation and when it started."""
        rows = self.s.execute(
            select(m.Job.job_id, m.Job.incarnation, m.Job.incarnation_started_at).where(
                m.Job.job_id.in_(sorted(set(job_ids)))
            )
        )
        return {j: (n, at) for j, n, at in rows.tuples()}

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

    def samples(self, job_id: str, degraded: bool, limit: int = 50) -> list[float]:
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

    # -- switches and flags -------------------------------------------------------------------
    def open_switch_faults(self) -> Sequence[m.SwitchFault]:
        return self.s.scalars(
            select(m.SwitchFault)
            .where(m.SwitchFault.cleared_at.is_(None))
            .order_by(m.SwitchFault.id)
        ).all()

    def open_switch_fault(self, row: m.SwitchFault) -> m.SwitchFault | None:
        return _insert_unless_taken(self.s, row)

    def switch_has_open_faults(self, switch: str) -> bool:
        """Whether some fault on a port cabled to `switch` is still evidence."""
        found = self.s.scalar(
            select(m.Fault.id)
            .where(m.Fault.switch == switch, m.Fault.resolved_at.is_(None))
            .limit(1)
        )
        return found is not None

    def clear_switch_fault(self, switch: str, now: datetime) -> m.SwitchFault | None:
        row = self.s.scalar(
            select(m.SwitchFault).where(
                m.SwitchFault.switch == switch, m.SwitchFault.cleared_at.is_(None)
            )
        )
        if row is not None:
            row.cleared_at = now
        return row

    def flag(self, row: m.MaintenanceFlag) -> m.MaintenanceFlag | None:
        return _insert_unless_taken(self.s, row)

    def open_flags(self) -> Sequence[m.MaintenanceFlag]:
        return self.s.scalars(
            select(m.MaintenanceFlag)
            .where(m.MaintenanceFlag.cleared_at.is_(None))
            .order_by(m.MaintenanceFlag.id)
        ).all()

    def clear_flag(self, flag_id: int, now: datetime) -> m.MaintenanceFlag | None:
        row = self.s.get(m.MaintenanceFlag, flag_id)
        if row is not None and row.cleared_at is None:
            row.cleared_at = now
            return row
        return None

    # -- topology and history for correlation and damping -------------------------------------
    def port_states(
        self, nodes: Iterable[str]
    ) -> dict[tuple[str, str, int], tuple[str, datetime | None]]:
        """Each port's level: its newest observed state and when it was observed."""
        rows = self.s.execute(
            select(m.Rnic.node, m.Rnic.name, m.Rnic.port, m.Rnic.state, m.Rnic.observed_at).where(
                m.Rnic.node.in_(list(nodes))
            )
        )
        return {(n, d, p): (st, at) for n, d, p, st, at in rows.tuples()}

    def switch_of(self, node: str, device: str, port: int) -> str | None:
        q = select(m.Rnic.switch).where(m.Rnic.node == node, m.Rnic.name == device)
        if port:
            q = q.where(m.Rnic.port == port)
        return self.s.scalar(q.limit(1))

    def ports_on_switch(self, switch: str) -> list[tuple[str, str, int]]:
        rows = self.s.execute(
            select(m.Rnic.node, m.Rnic.name, m.Rnic.port).where(m.Rnic.switch == switch)
        )
        return list(rows.tuples().all())

    def fabric_ports(self, node: str) -> list[tuple[str, int]]:
        rows = self.s.execute(
            select(m.Rnic.name, m.Rnic.port).where(m.Rnic.node == node, m.Rnic.switch.is_not(None))
        )
        return list(rows.tuples().all())

    def lock_switch(self, switch: str) -> None:
        """Serialise the correlation of one switch's faults until this transaction ends.

        Reports from the nodes under a failing switch arrive together. Each inserts
        its fault and then counts the switch's open faults; on PostgreSQL (READ
        COMMITTED) two of them could each miss the other's uncommitted fault, and
        the switch failure would never be inferred. With a transaction advisory
        lock per switch, taken after the insert and before the count, the last
        to take it sees every fault committed before it. SQLite has one writer
        already.
        """
        if self.s.get_bind().dialect.name == "postgresql":
            self.s.execute(
                text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
                {"key": f"railover switch {switch}"},
            )

    def recent_switch_faults(self, switch: str, since: datetime) -> Sequence[m.Fault]:
        return self.s.scalars(
            select(m.Fault).where(
                m.Fault.switch == switch, m.Fault.opened_at >= since, m.Fault.cleared_at.is_(None)
            )
        ).all()

    def port_transitions(
        self, node: str, device: str, port: int, since: datetime
    ) -> list[tuple[datetime, bool]]:
        """(time, up) of a port's down and up reports since `since`, oldest first."""
        rows = self.s.execute(
            select(m.Event.observed_at, m.Event.kind)
            .where(
                m.Event.node == node,
                m.Event.device == device,
                m.Event.kind.in_(["port_down", "port_up"]),
                m.Event.observed_at >= since,
                (m.Event.port == port) | m.Event.port.is_(None),
            )
            .order_by(m.Event.observed_at)
        )
        return [(at, kind == "port_up") for at, kind in rows.tuples()]

    def overdue_commands(
        self, now: datetime, limit: int = 200, command_id: int | None = None
    ) -> Sequence[m.Command]:
        q = (
            select(m.Command)
            .where(
                m.Command.state.in_(["issued", "delivered"]),
                m.Command.ack_deadline_at.is_not(None),
                m.Command.ack_deadline_at < now,
            )
            .order_by(m.Command.command_id)
            .limit(limit)
        )
        if command_id is not None:
            q = q.where(m.Command.command_id == command_id)
        if self.s.get_bind().dialect.name == "postgresql":
            # Several replicas sweep at once; each takes rows the others are not handling.
            q = q.with_for_update(skip_locked=True)
        return self.s.scalars(q).all()

    def job_commands(
        self, job_id: str, kinds: Sequence[str], states: Sequence[str]
    ) -> Sequence[m.Command]:
        return self.s.scalars(
            select(m.Command)
            .where(
                m.Command.job_id == job_id,
                m.Command.kind.in_(list(kinds)),
                m.Command.state.in_(list(states)),
            )
            .order_by(m.Command.command_id)
        ).all()

    def comm_commands(
        self, job_id: str, comm_id: int, kinds: Sequence[str], states: Sequence[str]
    ) -> Sequence[m.Command]:
        return self.s.scalars(
            select(m.Command).where(
                m.Command.job_id == job_id,
                m.Command.comm_id == comm_id,
                m.Command.kind.in_(list(kinds)),
                m.Command.state.in_(list(states)),
            )
        ).all()

    def delivery_latency_s(self, limit: int = 100) -> float | None:
        """Median time from issuing a command to its delivery, over recent deliveries."""
        rows = self.s.execute(
            select(m.Command.created_at, m.Command.delivered_at)
            .where(m.Command.delivered_at.is_not(None))
            .order_by(m.Command.command_id.desc())
            .limit(limit)
        ).tuples()
        lat = sorted((d - c).total_seconds() for c, d in rows if d is not None)
        return lat[len(lat) // 2] if lat else None


class MaintenanceRepo:
    """Planned maintenance windows."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def add(self, row: m.MaintenanceWindow) -> m.MaintenanceWindow:
        self.s.add(row)
        self.s.flush()
        return row

    def get(self, window_id: int, *, lock: bool = False) -> m.MaintenanceWindow | None:
        q = select(m.MaintenanceWindow).where(m.MaintenanceWindow.id == window_id)
        if lock:
            q = q.with_for_update().execution_options(populate_existing=True)
        return self.s.scalar(q)

    def listing(self, *, include_done: bool, limit: int) -> Sequence[m.MaintenanceWindow]:
        q = select(m.MaintenanceWindow)
        if not include_done:
            q = q.where(m.MaintenanceWindow.phase != "done")
        return self.s.scalars(
            q.order_by(m.MaintenanceWindow.start_at, m.MaintenanceWindow.id).limit(limit)
        ).all()

    def in_force(self, nodes: Iterable[str] | None) -> Sequence[m.MaintenanceWindow]:
        """Windows not yet done on `nodes` (all when None), and every switch-wide one."""
        q = select(m.MaintenanceWindow).where(m.MaintenanceWindow.phase != "done")
        if nodes is not None:
            q = q.where(
                m.MaintenanceWindow.switch.is_not(None) | m.MaintenanceWindow.node.in_(list(nodes))
            )
        return self.s.scalars(q.order_by(m.MaintenanceWindow.id)).all()

    def due(self, now: datetime, limit: int = 100) -> list[int]:
        return list(
            self.s.scalars(
                select(m.MaintenanceWindow.id)
                .where(
                    m.MaintenanceWindow.phase != "done",
                    m.MaintenanceWindow.due_at.is_not(None),
                    m.MaintenanceWindow.due_at <= now,
                )
                .order_by(m.MaintenanceWindow.due_at)
                .limit(limit)
            ).all()
        )

    def claim(self, window_id: int, now: datetime) -> m.MaintenanceWindow | None:
        """The window under its row lock if it is still due (another replica may have acted)."""
        q = select(m.MaintenanceWindow).where(
            m.MaintenanceWindow.id == window_id,
            m.MaintenanceWindow.phase != "done",
            m.MaintenanceWindow.due_at <= now,
        )
        if self.s.get_bind().dialect.name == "postgresql":
            q = q.with_for_update(skip_locked=True)
        return self.s.scalar(q.execution_options(populate_existing=True))

    def switch_known(self, switch: str) -> bool:
        return (
            self.s.scalar(select(m.Rnic.node).where(m.Rnic.switch == switch).limit(1)) is not None
        )

    def nodes_on_switch(self, switch: str) -> list[str]:
        return sorted(
            self.s.scalars(select(m.Rnic.node).where(m.Rnic.switch == switch).distinct()).all()
        )


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
        return _insert_unless_taken(self.s, row)

    def add_stall(self, row: m.CclStall) -> m.CclStall | None:
        """None when this collective's stall is already on record."""
        return _insert_unless_taken(self.s, row)

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
