"""Webhook subscriptions, deliveries (dead letters and replay), the audit log, and the
fleet's history for planning."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Query, Response

from scheduler_svc.api import routing
from scheduler_svc.api.deps import (
    FleetAuth,
    NowDep,
    SessionDep,
    SettingsDep,
    check_webhook_url,
)
from scheduler_svc.api.schemas.fields import JSON_INT_MAX, Id64, JobId, UtcTime
from scheduler_svc.errors import (
    VALIDATION,
    Conflict,
    Forbidden,
    NotFound,
    Unauthorized,
    Unprocessable,
    responses,
)
from scheduler_svc.fleet import admin
from scheduler_svc.fleet.repositories import AuditRepo, OutboxRepo, SubscriptionRepo
from scheduler_svc.fleet.schemas import (
    TARGET_PATTERN,
    AuditList,
    AuditOut,
    DeliveryList,
    DeliveryOut,
    DeliveryState,
    ReplayIn,
    ReplayOut,
    SubscriptionCreated,
    SubscriptionId,
    SubscriptionIn,
    SubscriptionList,
    SubscriptionOut,
)
from scheduler_svc.fleet.types import EventType
from scheduler_svc.planning.export import history_from
from scheduler_svc.planning.history import History

router = routing.router(prefix="/v1", tags=["fleet"])
AUTH = responses(Unauthorized, Forbidden)
Limit = Annotated[int, Query(ge=1, le=1000)]


@router.post(
    "/subscriptions",
    status_code=201,
    operation_id="create_subscription",
    responses=AUTH | VALIDATION,
)
def create_subscription(
    body: SubscriptionIn, session: SessionDep, who: FleetAuth, settings: SettingsDep
) -> SubscriptionCreated:
    """Subscribe a URL to signed CloudEvents; the secret is returned only here."""
    check_webhook_url("url", str(body.url), settings)
    return admin.create_subscription(session, body, who.token_id, datetime.now(UTC))


@router.get("/subscriptions", operation_id="list_subscriptions", responses=AUTH)
def list_subscriptions(session: SessionDep, _: FleetAuth) -> SubscriptionList:
    """Every subscription, without secrets."""
    rows = SubscriptionRepo(session).all()
    return SubscriptionList(subscriptions=[admin.subscription_out(r) for r in rows])


@router.get(
    "/subscriptions/{subscription_id}",
    operation_id="get_subscription",
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def get_subscription(
    subscription_id: SubscriptionId, session: SessionDep, _: FleetAuth
) -> SubscriptionOut:
    """One subscription, without its secret."""
    return admin.subscription_out(admin.get_subscription(session, subscription_id))


@router.delete(
    "/subscriptions/{subscription_id}",
    status_code=204,
    operation_id="delete_subscription",
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def delete_subscription(
    subscription_id: SubscriptionId, session: SessionDep, _: FleetAuth
) -> Response:
    """Delete a subscription; events not yet delivered to it are cancelled."""
    admin.delete_subscription(session, subscription_id)
    return Response(status_code=204)


@router.get("/deliveries", operation_id="list_deliveries", responses=AUTH | VALIDATION)
def list_deliveries(
    session: SessionDep,
    _: FleetAuth,
    *,
    state: DeliveryState | None = None,
    target: Annotated[
        str | None,
        Query(
            max_length=160,
            pattern=TARGET_PATTERN,
            description="sub:<id>, job:<job_id>, k8s or slurm",
        ),
    ] = None,
    job_id: JobId | None = None,
    event_type: EventType | None = None,
    after_id: Annotated[int, Query(ge=0, le=JSON_INT_MAX)] = 0,
    limit: Limit = 100,
) -> DeliveryList:
    """Deliveries in outbox order; state=dead lists the dead letters."""
    rows = OutboxRepo(session).list(
        state=state,
        target=target,
        job_id=job_id,
        event_type=None if event_type is None else event_type.value,
        after_id=after_id,
        limit=limit,
    )
    out = [admin.delivery_out(d, e) for d, e in rows]
    return DeliveryList(
        deliveries=out, next_after_id=out[-1].delivery_id if len(out) == limit else None
    )


@router.post(
    "/deliveries/{delivery_id}/replay",
    operation_id="replay_delivery",
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict),
)
def replay_delivery(delivery_id: Id64, session: SessionDep, _: FleetAuth) -> DeliveryOut:
    """Send a dead delivery again, with a fresh attempt budget."""
    return admin.replay_one(session, delivery_id, datetime.now(UTC))


@router.post("/deliveries/replay", operation_id="replay_deliveries", responses=AUTH | VALIDATION)
def replay_deliveries(body: ReplayIn, session: SessionDep, _: FleetAuth) -> ReplayOut:
    """Send dead deliveries again: the ids given, or every dead one of a target."""
    return ReplayOut(
        replayed=admin.replay(session, body.delivery_ids, body.target, datetime.now(UTC))
    )


@router.get("/audit", operation_id="list_audit", responses=AUTH | VALIDATION)
def list_audit(
    session: SessionDep,
    _: FleetAuth,
    *,
    token_id: Annotated[str | None, Query(max_length=32, pattern=r"^[0-9a-f]{1,32}$")] = None,
    before_id: Annotated[int | None, Query(ge=1, le=JSON_INT_MAX)] = None,
    limit: Limit = 100,
) -> AuditList:
    """State-changing calls, newest first: who (token, role), what and when."""
    rows = AuditRepo(session).list(before_id=before_id, token_id=token_id, limit=limit)
    entries = [
        AuditOut(
            id=r.id,
            at=r.at,
            token_id=r.token_id,
            role=r.role,
            method=r.method,
            path=r.path,
            operation=r.operation,
            status=r.status,
            client=r.client,
            detail=r.detail,
            count=r.count,
        )
        for r in rows
    ]
    return AuditList(
        entries=entries, next_before_id=entries[-1].id if len(entries) == limit else None
    )


@router.get(
    "/history",
    operation_id="export_history",
    responses=responses(Unauthorized, Forbidden, Unprocessable) | VALIDATION,
)
def export_history(
    session: SessionDep,
    settings: SettingsDep,
    _: FleetAuth,
    now: NowDep,
    *,
    since: Annotated[
        UtcTime | None, Query(description="From this time; default: the first registration")
    ] = None,
    until: Annotated[UtcTime | None, Query(description="Up to this time; default: now")] = None,
) -> History:
    """What the service recorded in [since, until), as `railover export` writes it, for
    `railover simulate --history` and `railover twin --history`: nodes, faults, switch
    failures, jobs and decisions with their commands' outcomes. No secrets."""
    end = until or now
    if since is not None and since >= end:
        raise Unprocessable(
            f"since: {since.isoformat()} is not before until {end.isoformat()}; "
            "give a window that ends after it starts"
        )
    return history_from(session, settings, since, end, now)
