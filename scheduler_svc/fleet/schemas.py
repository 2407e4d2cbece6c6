"""Wire models of the fleet API: subscriptions, deliveries, audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field

from scheduler_svc.api.schemas.fields import JSON_INT_MAX, JobId, Strict, WebUrl, whole_number
from scheduler_svc.fleet.types import EventType

DeliveryState = Literal["pending", "delivered", "dead", "cancelled"]
SubscriptionId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^sub_[0-9a-f]{1,32}$")]
# sub:<subscription_id>, job:<job_id>, k8s or slurm.
TARGET_PATTERN = r"^(sub:sub_[0-9a-f]{1,32}|job:[A-Za-z0-9][\w.:-]{0,127}|k8s|slurm)$"


class SubscriptionIn(Strict):
    url: WebUrl
    event_types: Annotated[list[EventType], Field(max_length=64)] = Field(
        default_factory=list, description="Only these event types; empty for all"
    )
    job_id: JobId | None = Field(
        default=None, description="Only this job's events; unset for every job and cluster events"
    )
    description: Annotated[str, Field(max_length=200)] = ""
    secret: (
        Annotated[str, Field(min_length=16, max_length=128, pattern=r"^[\x21-\x7e]+$")] | None
    ) = Field(
        default=None, description="HMAC secret; generated when omitted. Never returned again."
    )


class SubscriptionOut(BaseModel):
    subscription_id: str
    url: str
    event_types: list[str]
    job_id: str | None
    description: str
    created_at: datetime
    created_by: str | None


class SubscriptionCreated(SubscriptionOut):
    secret: str = Field(description="Shown once: verify Railover-Signature with it")


class SubscriptionList(BaseModel):
    subscriptions: list[SubscriptionOut]


class DeliveryOut(BaseModel):
    delivery_id: int
    target: str = Field(description="sub:<subscription_id>, job:<job_id> (notify_url), k8s, slurm")
    url: str
    state: DeliveryState
    attempts: int
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    dead_at: datetime | None
    event_id: str
    event_type: str
    job_id: str | None
    subject: str
    sequence: int = Field(description="The event's place in the outbox (CloudEvents sequence)")


class DeliveryList(BaseModel):
    deliveries: list[DeliveryOut]
    next_after_id: int | None = Field(description="Pass as after_id for the next page")


class ReplayIn(Strict):
    delivery_ids: (
        Annotated[
            list[
                Annotated[
                    int, Field(strict=True, ge=1, le=JSON_INT_MAX), BeforeValidator(whole_number)
                ]
            ],
            Field(max_length=10000),
        ]
        | None
    ) = Field(
        default=None, description="These dead deliveries; unset for every dead one matching target"
    )
    target: Annotated[str, Field(max_length=160, pattern=TARGET_PATTERN)] | None = None


class ReplayOut(BaseModel):
    replayed: int


class AuditOut(BaseModel):
    id: int
    at: datetime
    token_id: str | None
    role: str | None
    method: str
    path: str
    operation: str | None
    status: int
    client: str | None
    detail: str | None = None
    count: int = Field(
        default=1,
        description="Requests the entry stands for: refused ones without valid credentials "
        "are one entry per peer, status and minute (method and path *)",
    )


class AuditList(BaseModel):
    entries: list[AuditOut]
    next_before_id: int | None
