"""Wire models of the fleet API: subscriptions, deliveries, audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl

from scheduler_svc.fleet.types import EventType

DeliveryState = Literal["pending", "delivered", "dead", "cancelled"]


class SubscriptionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: HttpUrl
    event_types: list[EventType] = Field(
        default_factory=list, description="Only these event types; empty for all"
    )
    job_id: Annotated[str, Field(max_length=128)] | None = Field(
        default=None, description="Only this job's events; unset for every job and cluster events"
    )
    description: Annotated[str, Field(max_length=200)] = ""
    secret: Annotated[str, Field(min_length=16, max_length=128)] | None = Field(
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


class ReplayIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    delivery_ids: Annotated[list[int], Field(max_length=10000)] | None = Field(
        default=None, description="These dead deliveries; unset for every dead one matching target"
    )
    target: str | None = None


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


class AuditList(BaseModel):
    entries: list[AuditOut]
    next_before_id: int | None
