"""What the service has recorded, read for `railover export`: inventory, faults, switch
failures, jobs and decisions with their commands' outcomes, within a time window.

Read only: it never migrates or writes. `schema_state` says whether a database is a
Railover store at all, and at which migration, before anything else is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, func, inspect, select, text
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m
from scheduler_svc.store.db import newest_revision

# Tables a Railover store has at every migration since the first.
CORE_TABLES = ("nodes", "rnics", "jobs", "faults", "decisions", "alembic_version")


@dataclass(frozen=True, slots=True)
class SchemaState:
    """`missing`: the core tables it lacks (not a Railover store when any); `revision`:
    the migration it is at; `head`: the newest this program knows."""

    missing: tuple[str, ...]
    revision: str | None
    head: str

    @property
    def current(self) -> bool:
        return not self.missing and self.revision == self.head


def schema_state(engine: Engine) -> SchemaState:
    head = newest_revision()
    tables = set(inspect(engine).get_table_names())
    missing = tuple(t for t in CORE_TABLES if t not in tables)
    revision = None
    if "alembic_version" in tables:
        with engine.connect() as conn:
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    return SchemaState(missing, revision, head)


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    registered_at: datetime
    gpus: int
    rnics: int  # devices
    ports: int  # (device, port) pairs: the links
    switches: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class JobRow:
    job: m.Job
    ranks: int
    nodes: int


@dataclass(frozen=True, slots=True)
class DecisionRow:
    decision: m.Decision
    # (command kind, state) -> how many of the decision's commands
    outcomes: dict[tuple[str, str], int]


class HistoryRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def nodes(self) -> list[NodeRow]:
        out = []
        for node in self.s.scalars(select(m.Node).order_by(m.Node.name)):
            out.append(
                NodeRow(
                    name=node.name,
                    registered_at=node.registered_at,
                    gpus=len(node.gpus),
                    rnics=len({r.name for r in node.rnics}),
                    ports=len(node.rnics),
                    switches=tuple(sorted({r.switch for r in node.rnics if r.switch})),
                )
            )
        return out

    def faults(self, since: datetime, until: datetime) -> Sequence[m.Fault]:
        """Faults opened in [since, until)."""
        return self.s.scalars(
            select(m.Fault)
            .where(m.Fault.opened_at >= since, m.Fault.opened_at < until)
            .order_by(m.Fault.opened_at, m.Fault.id)
        ).all()

    def switch_faults(self, since: datetime, until: datetime) -> Sequence[m.SwitchFault]:
        return self.s.scalars(
            select(m.SwitchFault)
            .where(m.SwitchFault.opened_at >= since, m.SwitchFault.opened_at < until)
            .order_by(m.SwitchFault.opened_at, m.SwitchFault.id)
        ).all()

    def jobs(self, until: datetime) -> list[JobRow]:
        """Jobs registered before `until`, each with its rank and node counts."""
        counts = {
            job_id: (ranks, nodes)
            for job_id, ranks, nodes in self.s.execute(
                select(
                    m.JobRank.job_id, func.count(), func.count(func.distinct(m.JobRank.node))
                ).group_by(m.JobRank.job_id)
            )
        }
        rows = self.s.scalars(
            select(m.Job).where(m.Job.created_at < until).order_by(m.Job.created_at, m.Job.job_id)
        ).all()
        return [JobRow(j, *counts.get(j.job_id, (0, 0))) for j in rows]

    def decisions(self, since: datetime, until: datetime) -> list[DecisionRow]:
        rows = self.s.scalars(
            select(m.Decision)
            .where(m.Decision.created_at >= since, m.Decision.created_at < until)
            .order_by(m.Decision.created_at, m.Decision.seq)
        ).all()
        outcomes: dict[str, dict[tuple[str, str], int]] = {}
        ids = [d.decision_id for d in rows]
        for chunk in range(0, len(ids), 500):
            for decision_id, kind, state, n in self.s.execute(
                select(m.Command.decision_id, m.Command.kind, m.Command.state, func.count())
                .where(m.Command.decision_id.in_(ids[chunk : chunk + 500]))
                .group_by(m.Command.decision_id, m.Command.kind, m.Command.state)
            ):
                outcomes.setdefault(decision_id, {})[(kind, state)] = n
        return [DecisionRow(d, outcomes.get(d.decision_id, {})) for d in rows]

    def first_record(self) -> datetime | None:
        """The earliest node registration: where a history without --since begins."""
        return self.s.scalar(select(func.min(m.Node.registered_at)))
