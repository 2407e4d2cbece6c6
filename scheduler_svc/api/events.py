"""Agents' reports: batched, idempotent by event id, decided on at once.

The evidence commits first, in a transaction shared with the other reports that
arrive while one is being written (store/groupcommit.py); then the jobs it
touched are reconciled by a pass that started after that commit, shared with
the other reports of a storm (services/passes.py). The answer comes after both.
"""

from __future__ import annotations

import time

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.api import routing
from scheduler_svc.api.deps import AgentAuth, NowDep, PassesDep, SettingsDep, WritesDep
from scheduler_svc.api.schemas.events import EventBatch, EventIn, EventsAccepted
from scheduler_svc.api.schemas.tokens import Role
from scheduler_svc.errors import (
    VALIDATION,
    Forbidden,
    NotFound,
    Unauthorized,
    Unprocessable,
    responses,
)
from scheduler_svc.fleet import audit
from scheduler_svc.services import targets
from scheduler_svc.services.events import IngestResult, ingest

router = routing.router(prefix="/v1", tags=["events"])
ACCEPTED = 202


@router.post(
    "/events",
    status_code=ACCEPTED,
    operation_id="post_events",
    responses=responses(Unauthorized, Forbidden, NotFound, Unprocessable) | VALIDATION,
)
def post_events(
    body: EventBatch,
    *,
    who: AgentAuth,
    settings: SettingsDep,
    now: NowDep,
    passes: PassesDep,
    writes: WritesDep,
) -> EventsAccepted:
    """Report events; a fault reconciles at once every job with a rank on the node.

    `decisions` lists what the pass that covered this batch decided; when many
    nodes report at once, one pass covers many batches and decides once.
    """
    started = time.perf_counter()
    if len(body.events) > settings.max_events_per_request:
        raise Unprocessable(
            f"events: {len(body.events)} events in one request, at most "
            f"{settings.max_events_per_request}; split the batch"
        )
    nodes = {e.node for e in body.events}
    for n in sorted(nodes):
        who.require_node(n)
    events: list[EventIn] = list(body.events)
    unaudited = audit.pending()  # taken here: `record` may run in another request's thread

    def record(session: Session) -> IngestResult:
        known = targets.registered_ports(session, nodes)
        unknown = sorted(nodes - known.keys())
        if unknown:
            raise NotFound(
                f"node {unknown[0]!r} is not registered; PUT /v1/nodes/{unknown[0]} first"
            )
        targets.refuse_unknown(
            session,
            events,
            known,
            now=now,
            future_skew_s=settings.observed_at_future_skew_s,
            agent=who.role == Role.AGENT,
        )
        result = ingest(session, events, now=now, settings=settings)
        if unaudited is not None:  # the report's audit entry, in the evidence's commit
            audit.add(session, unaudited, ACCEPTED)
        return result

    # Committed (the evidence, before any pass that is to see it starts) when this returns.
    result = writes.run(record)
    if unaudited is not None:
        unaudited.status = ACCEPTED
    faults_opened = len(result.faults_opened)
    decisions = passes.reconcile(result.jobs) if result.jobs else []
    took = time.perf_counter() - started
    for action in sorted({d.action for d in decisions}):
        metrics.DECISION_LATENCY.labels(action=action).observe(took)
    return EventsAccepted(
        accepted=result.accepted,
        duplicates=result.duplicates,
        faults_opened=faults_opened,
        decisions=[d.decision_id for d in decisions],
    )
