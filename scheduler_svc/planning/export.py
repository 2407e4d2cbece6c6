"""`railover export`: the fleet's history (planning.history.History) read from a store.

Read only: the store is never migrated or written. A database that is not a Railover
store, or one at another migration than this program's, is refused with what to do.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from scheduler_svc.config import Settings
from scheduler_svc.planning.history import (
    COMPONENT,
    DecisionRecord,
    FaultRecord,
    History,
    JobRecord,
    NodeRecord,
    ServiceRules,
    SwitchFaultRecord,
    Window,
)
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_read_sessionmaker
from scheduler_svc.store.history import HistoryRepo, schema_state


class NotAStore(Exception):
    """The database is not a Railover store, or not at this program's schema."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def export_history(
    settings: Settings, shown: str, since: datetime | None, until: datetime, now: datetime
) -> History:
    """Everything recorded in [since, until); `since` unset: from the first registration.
    `shown` names the store in errors (its URL without a password)."""
    engine = make_engine(settings.sqlalchemy_url)
    try:
        state = schema_state(engine)
        if state.missing:
            raise NotAStore(
                f"{shown} is not a Railover store (it has no {', '.join(state.missing)} table)",
                "give the store `railover serve` uses: --db or RAILOVER_DB_URL",
            )
        if not state.current:
            raise NotAStore(
                f"the store {shown} is at migration {state.revision}, this railover reads "
                f"{state.head}",
                "run `railover db upgrade` with the same --db first (or export with the "
                "railover version that serves it)",
            )
        with make_read_sessionmaker(engine)() as session:
            return history_from(session, settings, since, until, now)
    finally:
        engine.dispose()


def history_from(
    session: Session, settings: Settings, since: datetime | None, until: datetime, now: datetime
) -> History:
    """Everything `session` (a read of a store at this program's schema) holds in
    [since, until); `since` unset: from the first registration (an empty window when that
    is after `until`)."""
    repo = HistoryRepo(session)
    start = since or min(repo.first_record() or until, until)
    return History(
        exported_at=now,
        window=Window(since=start, until=until),
        service=ServiceRules(
            failback_damping_s=settings.failback_damping_s,
            fault_quiet_s=settings.fault_quiet_s,
            correlation_window_s=settings.correlation_window_s,
            policy=settings.policy.value,
        ),
        nodes=[
            NodeRecord(
                name=n.name,
                registered_at=n.registered_at,
                gpus=n.gpus,
                rnics=n.rnics,
                ports=n.ports,
                switches=list(n.switches),
            )
            for n in repo.nodes()
        ],
        **_faults(repo, start, until, settings.correlation_window_s),
        jobs=[_job(r.job, r.ranks, r.nodes) for r in repo.jobs(until)],
        decisions=[
            DecisionRecord(
                decision_id=d.decision.decision_id,
                job_id=d.decision.job_id,
                created_at=d.decision.created_at,
                trigger=d.decision.trigger,
                fault_id=d.decision.fault_id,
                action=d.decision.action,
                reason=d.decision.reason,
                saved_gpu_s=d.decision.saved_gpu_s,
                outcomes=_nested(d.outcomes),
            )
            for d in repo.decisions(start, until)
        ],
    )


def _faults(
    repo: HistoryRepo, since: datetime, until: datetime, window_s: float
) -> dict[str, list[FaultRecord] | list[SwitchFaultRecord]]:
    switches = repo.switch_faults(since, until)

    def part_of(f: m.Fault) -> int | None:
        """The inferred switch failure a port fault belongs to: on its switch, opened
        within the correlation window before the inference, or while it was open."""
        if f.kind not in ("link_down", "rnic_fatal") or f.switch is None:
            return None
        for s in switches:
            end = s.cleared_at or until
            before = (s.opened_at - f.opened_at).total_seconds()
            if s.switch == f.switch and before <= window_s and f.opened_at <= end:
                return s.id
        return None

    return {
        "faults": [
            FaultRecord(
                fault_id=f.id,
                node=f.node,
                device=f.device,
                port=f.port,
                kind=f.kind,
                component=COMPONENT.get(f.kind, "other"),
                opened_at=f.opened_at,
                cleared_at=f.cleared_at,
                resolved_at=f.resolved_at,
                duration_s=_seconds(f.opened_at, f.cleared_at),
                switch=f.switch,
                switch_fault_id=part_of(f),
            )
            for f in repo.faults(since, until)
        ],
        "switch_faults": [
            SwitchFaultRecord(
                switch_fault_id=s.id,
                switch=s.switch,
                opened_at=s.opened_at,
                cleared_at=s.cleared_at,
                duration_s=_seconds(s.opened_at, s.cleared_at),
                nodes=len(s.nodes),
            )
            for s in switches
        ],
    }


def _job(job: m.Job, ranks: int, nodes: int) -> JobRecord:
    # Never notify_url (it may carry credentials), ccl or the desired state.
    return JobRecord(
        job_id=job.job_id,
        created_at=job.created_at,
        ranks=ranks,
        nodes=nodes,
        checkpoint_interval_s=job.checkpoint_interval_s,
        checkpoint_kind=job.last_checkpoint_kind,
        reload_s=job.reload_s,
        detect_s=job.detect_s,
        timeout_s=job.timeout_s,
        declared_k=job.slowdown_k,
        measured_k=job.measured_k,
        dp_size=job.dp_size,
        incarnation=job.incarnation,
        mode=job.mode,
    )


def _seconds(start: datetime, end: datetime | None) -> float | None:
    return None if end is None else (end - start).total_seconds()


def _nested(outcomes: dict[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (kind, state), n in sorted(outcomes.items()):
        out.setdefault(kind, {})[state] = n
    return out
