"""Service settings: one class, environment prefix RAILOVER_."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DB_URL = "sqlite:///railover.db"


def is_loopback(host: str) -> bool:
    """True for addresses that only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """Everything `railover serve` can be told; see README for each variable."""

    model_config = SettingsConfigDict(env_prefix="RAILOVER_", extra="ignore")

    db_url: str = Field(default=DEFAULT_DB_URL, description="SQLAlchemy URL of the store")
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    # With no token in the store, a service bound to loopback answers without
    # authentication so a first `railover serve` is usable on a laptop. It never
    # does so on a routable address (`serve` refuses to start there).
    allow_anonymous_loopback: bool = True
    # Tie-break cap for s-Bond: GPUs that may back up onto RNICs behind one PCIe
    # switch. None spreads them evenly over the switches that hold fabric RNICs.
    backup_cap_per_switch: Annotated[int | None, Field(ge=1)] = None
    default_k: tuple[float, ...] = (1.03, 1.20, 1.50)
    commands_wait_max_s: Annotated[float, Field(gt=0, le=120)] = 30.0
    # The schema caps a batch at 1000 events; this may only lower it.
    max_events_per_request: Annotated[int, Field(ge=1, le=1000)] = 1000
    # Request bodies over this are refused with 413 before they are parsed.
    max_body_bytes: Annotated[int, Field(ge=1024, le=256 * 2**20)] = 16 * 2**20
    # An event observed further in the future than this (by the service's clock) is
    # refused: a wrong agent clock must not pass for "long since the checkpoint".
    # Old events are accepted and decided as old.
    observed_at_future_skew_s: Annotated[float, Field(ge=0, le=86400)] = 300.0
    log_level: str = "INFO"

    # --- cluster-wide coordination ---
    # A command not acknowledged by this deadline is re-issued (a new id, so
    # the agent hands it on again), and after the last attempt marked failed.
    command_ack_timeout_s: Annotated[float, Field(gt=0)] = 15.0
    command_max_attempts: Annotated[int, Field(ge=1, le=20)] = 3
    # DCR / fail-back switch point: highest ops_done + max(min, rate x latency x safety).
    switch_min_offset_ops: Annotated[int, Field(ge=1)] = 20
    switch_safety: Annotated[float, Field(ge=1)] = 2.0
    # Used until commands have been delivered and their latency measured.
    delivery_latency_default_s: Annotated[float, Field(gt=0)] = 0.5
    # Fail over at once; fail back only after this long up and quiet.
    failback_damping_s: Annotated[float, Field(ge=0)] = 120.0
    # More than this many downs in the window keeps the port on its backup, flagged.
    flap_max: Annotated[int, Field(ge=1)] = 4
    flap_window_s: Annotated[float, Field(gt=0)] = 600.0
    # Port faults on one fabric switch from this many nodes within the window: the switch.
    correlation_window_s: Annotated[float, Field(gt=0)] = 2.0
    correlation_min_nodes: Annotated[int, Field(ge=2)] = 3
    # Repair time assumed for a failed RNIC/link when deciding at a checkpoint.
    default_repair_s: Annotated[float, Field(gt=0)] = 86400.0
    # Iteration-time samples needed on each side before a measured k is trusted.
    measured_k_min_samples: Annotated[int, Field(ge=2)] = 5
    # A measured k this far from the one used (relative) re-decides.
    measured_k_tolerance: Annotated[float, Field(gt=0)] = 0.02
    # NVL transit costs GPU memory per channel; the job's cap on it.
    nvl_mb_per_channel: Annotated[float, Field(gt=0)] = 40.0
    nvl_cap_mb: Annotated[float, Field(ge=0)] = 512.0
    coordinator_interval_s: Annotated[float, Field(gt=0, le=60)] = 0.5
    coordinator: bool = True
    # --- fleet notification (scheduler_svc.fleet) ---
    # Signs deliveries to each job's notify_url (subscriptions carry their own secret);
    # with none set, events are delivered to subscriptions only.
    notify_secret: SecretStr | None = None
    webhook_timeout_s: Annotated[float, Field(gt=0, le=60)] = 10.0
    webhook_max_attempts: Annotated[int, Field(ge=1, le=100)] = 12
    webhook_backoff_base_s: Annotated[float, Field(gt=0)] = 1.0
    webhook_backoff_max_s: Annotated[float, Field(gt=0)] = 600.0
    # Idle re-read of the outbox: how soon other replicas' events and due retries go out.
    delivery_poll_s: Annotated[float, Field(gt=0, le=60)] = 1.0
    delivery_concurrency: Annotated[int, Field(ge=1, le=64)] = 4
    delivery_worker: bool = True
    k8s_enabled: bool = False
    # Empty: in-cluster service account, else ~/.kube/config. Set for a plain API URL.
    k8s_api_url: str | None = None
    k8s_token_file: str | None = None
    k8s_node_policy: Literal["condition", "taint", "cordon", "taint_and_cordon"] = "taint"
    k8s_taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    k8s_event_namespace: str = "default"
    slurm_enabled: bool = False
    # Split like a shell line first, then each word is formatted: values never re-split.
    slurm_drain_command: str = 'scontrol update NodeName={node} State=DRAIN Reason="{reason}"'
    slurm_requeue_command: str = "scontrol requeue {job_id}"

    @field_validator("default_k")
    @classmethod
    def _k_at_least_one(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or any(k < 1.0 for k in value):
            raise ValueError("default_k needs at least one entry, each >= 1")
        return value

    @property
    def sqlalchemy_url(self) -> str:
        """The URL with the psycopg 3 driver chosen for plain postgresql:// URLs."""
        url = self.db_url
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        return url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
