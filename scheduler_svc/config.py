"""Service settings: one class, environment prefix RAILOVER_, and the settings reference.

Every field carries its meaning in `description`: `railover config` and the README's
settings table are generated from the service's and the agent's settings classes (the
reference at the end of this module), so a field added there is listed everywhere with
no further edit: its variable name, its type with bounds, its default and its
`description`. `python -m scheduler_svc.config README.md` rewrites the README's table
between its markers; a test fails when the two drift apart.
"""

from __future__ import annotations

import enum
import os
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import Field, SecretStr, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from scheduler_svc.engine.decision import Policy
from scheduler_svc.settings_env import (
    SERVICE_LINK_VALUE,
    check_store_url,
    parse_list,
    unknown_variables,
)

DEFAULT_DB_URL = "sqlite:///railover.db"
DEFAULT_PORT = 8080

# RAILOVER_* variables that belong to other programs, so the service does not call
# them misspellings: the agent's and the plugin's own prefixes, the torchrun hook's
# variables (examples/railover_torchrun.py) and the test suite's switches.
FOREIGN_PREFIXES = ("RAILOVER_AGENT_", "RAILOVER_PLUGIN_", "RAILOVER_TEST_")
FOREIGN_NAMES = frozenset(
    {
        "RAILOVER_URL",
        "RAILOVER_TOKEN",
        "RAILOVER_JOB_ID",
        "RAILOVER_NODE_NAME",
        "RAILOVER_CHECKPOINT_INTERVAL_S",
        "RAILOVER_RELOAD_S",
        "RAILOVER_TIMEOUT_S",
        "RAILOVER_NOTIFY_URL",
        "RAILOVER_WEBHOOK_SECRET",
        "RAILOVER_VIEWER_TOKEN",
        "RAILOVER_REQUIRE_TOOLS",
    }
)


def service_variable_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    return unknown_variables(
        os.environ if environ is None else environ,
        Settings,
        ignore_prefixes=FOREIGN_PREFIXES,
        ignore_names=FOREIGN_NAMES,
    )


class Settings(BaseSettings):
    """Everything `railover serve` can be told: `railover config` lists each variable."""

    model_config = SettingsConfigDict(env_prefix="RAILOVER_", extra="ignore")

    db_url: str = Field(
        default=DEFAULT_DB_URL,
        description="The store: sqlite:///path/file.db (one replica) or "
        "postgresql://user@host/db (replicas side by side)",
    )
    evidence_in_memory: bool = Field(
        default=True,
        description="Keep the fabric's evidence (open faults, port levels, quarantines, switch "
        "failures, maintenance windows) in memory, checked against the store's evidence stamp "
        "at every read; false reads it from the store every time",
    )
    host: str = Field(
        default="127.0.0.1",
        description="Address to listen on; a routable one needs API tokens to exist first",
    )
    port: Annotated[int, Field(ge=0, le=65535)] = Field(
        default=DEFAULT_PORT,
        description="Port to listen on (0 picks a free one); a Kubernetes service link "
        "(tcp://IP:PORT) here is ignored",
    )
    # Off unless an operator turns it on (`railover serve --dev`, the demo): a service
    # started any other way (`uvicorn --factory`, behind a sidecar proxy that forwards
    # from loopback) must not answer every loopback peer as the fleet role. Even on, it
    # holds only on a loopback bind, for loopback peers, while no token exists.
    allow_anonymous_loopback: bool = Field(
        default=False,
        description="On loopback with no token in the store, answer without authentication "
        "(development only: `railover serve --dev` sets it)",
    )
    # Each request's authentication is a store read; kept this long, an idle fleet's poll
    # renewals skip it (scheduler_svc/api/token_cache.py: what is kept, and what empties it).
    auth_cache_s: Annotated[float, Field(ge=0, le=60)] = Field(
        default=2.0,
        description="How long a token, and whether any exists, is trusted once read; a "
        "token revoked or created elsewhere (railover token, another replica) takes effect "
        "here within this; 0 reads the store on every request",
    )
    backup_cap_per_switch: Annotated[int | None, Field(ge=1)] = Field(
        default=None,
        description="s-Bond tie-break: GPUs that may back up onto the RNICs behind one PCIe "
        "switch; unset spreads them evenly",
    )
    default_k: Annotated[tuple[float, ...], NoDecode] = Field(
        default=(1.03, 1.20, 1.50),
        description="Slowdown k failed over by concurrent faults, when nothing better is "
        "known (1.03,1.2,1.5 or JSON)",
    )
    commands_wait_max_s: Annotated[float, Field(gt=0, le=120)] = Field(
        default=30.0, description="Longest long-poll an agent may ask for on /v1/commands"
    )
    commands_stream_max_s: Annotated[float, Field(gt=0, le=86400)] = Field(
        default=1800.0,
        description="Longest a command stream stays open (each ends 0-10 % sooner, spread); "
        "the agent reconnects at once, and its token is checked again",
    )
    commands_streams_per_node: Annotated[int, Field(ge=1, le=64)] = Field(
        default=4,
        description="Command streams one node may hold open on a replica; a newer one ends "
        "the oldest (reason replaced)",
    )
    max_events_per_request: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=1000,
        description="Events one agent request may carry (the schema caps a batch at 1000)",
    )
    max_body_bytes: Annotated[int, Field(ge=1024, le=256 * 2**20)] = Field(
        default=16 * 2**20, description="Request bodies over this are refused with 413 unparsed"
    )
    # A wrong agent clock must not pass for "long since the checkpoint".
    observed_at_future_skew_s: Annotated[float, Field(ge=0, le=86400)] = Field(
        default=300.0,
        description="Events observed further ahead of the service's clock are refused; old "
        "ones are accepted and decided as old",
    )
    # --- HTTP server limits (scheduler_svc/serving.py) ---
    http_header_timeout_s: Annotated[float, Field(gt=0, le=300)] = Field(
        default=10.0,
        description="A request's headers must arrive within this of its first byte (or of "
        "the connection's opening); otherwise 408 and the connection is closed",
    )
    http_body_timeout_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=60.0,
        description="A request's body must arrive within this of its headers (a body "
        "trickled, or shorter than its Content-Length); otherwise 408 and closed",
    )
    http_max_header_bytes: Annotated[int, Field(ge=4096, le=2**20)] = Field(
        default=64 * 1024,
        description="Request line and headers over this many bytes: 431, closed unread",
    )
    http_max_connections: Annotated[int, Field(ge=16, le=1_000_000)] = Field(
        default=4096,
        description="Open connections (agents' command streams included); one more is "
        "answered 503 and closed at once. The descriptor limit is raised to fit it",
    )
    http_max_connections_per_peer: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=512,
        description="Open connections from one address (raise it behind a proxy that "
        "forwards every agent from one address); one more is answered 503",
    )
    http_parser: Literal["auto", "httptools", "h11"] = Field(
        default="auto",
        description="HTTP/1.1 parser: httptools where installed (auto), else h11; both "
        "under the same limits",
    )
    http_keep_alive_s: Annotated[int, Field(ge=1, le=600)] = Field(
        default=5, description="An idle kept-alive connection is closed after this"
    )
    # --- retention (scheduler_svc/services/retention.py) ---
    events_retention_s: Annotated[float, Field(ge=3600)] = Field(
        default=7 * 86400.0,
        json_schema_extra={"doc_default": "604800 (7 days)"},
        description="Agent reports are kept this long after they came (their ids then no "
        "longer deduplicate a replay)",
    )
    audit_retention_s: Annotated[float, Field(ge=3600)] = Field(
        default=30 * 86400.0,
        json_schema_extra={"doc_default": "2592000 (30 days)"},
        description="Audit log entries are kept this long",
    )
    deliveries_retention_s: Annotated[float, Field(ge=3600)] = Field(
        default=7 * 86400.0,
        json_schema_extra={"doc_default": "604800 (7 days)"},
        description="Finished webhook and fleet-action deliveries (delivered, dead, "
        "cancelled) are kept this long",
    )
    dead_letters_max: Annotated[int, Field(ge=100)] = Field(
        default=10000, description="Dead letters kept at most; the oldest go first"
    )
    ready_probe_timeout_s: Annotated[float, Field(gt=0, le=60)] = Field(
        default=2.0,
        description="/readyz commits a probe write: waited for longer than this (the store "
        "locked, full or read-only), the service answers 503 not ready",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Log level of the service"
    )

    # --- cluster-wide coordination ---
    command_ack_timeout_s: Annotated[float, Field(gt=0)] = Field(
        default=15.0,
        description="A command not acknowledged by then is re-issued under a new id",
    )
    command_max_attempts: Annotated[int, Field(ge=1, le=20)] = Field(
        default=3, description="Issues of one command before it is failed and the job re-decided"
    )
    # DCR / fail-back switch point: highest ops_done + max(min, rate x latency x safety).
    switch_min_offset_ops: Annotated[int, Field(ge=1)] = Field(
        default=20, description="Smallest switch-point offset, in collective ops"
    )
    switch_safety: Annotated[float, Field(ge=1)] = Field(
        default=2.0,
        description="Switch-point offset = op rate × delivery latency × this, at least the minimum",
    )
    delivery_latency_default_s: Annotated[float, Field(gt=0)] = Field(
        default=0.5, description="Command delivery latency assumed until one has been measured"
    )
    failback_damping_s: Annotated[float, Field(ge=0)] = Field(
        default=120.0, description="A port up and quiet this long fails back (failover is at once)"
    )
    policy: Policy = Field(
        default=Policy.RAILOVER,
        description="How faults are answered: railover (the cost model, restarts at "
        "checkpoints by the repair rule); restart-only, nccl-failover-only (never fail back) "
        "and failover-always are the behaviours the fleet twin compares it with",
    )
    spare_reserve: Annotated[int, Field(ge=0, le=65536)] = Field(
        default=0,
        description="Spare nodes kept for faults only a replacement fixes (a lost GPU, a "
        "dead node): a job restarts to escape a fault it could fail over from only while "
        "more spares than this are free, by the count its fleet manager last said "
        "(spares_free); 0 keeps none back",
    )
    hard_failures_per_h: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] = Field(
        default=0.0,
        description="Faults only a replacement fixes (lost GPUs, dead nodes) across the fleet, "
        "per hour: a restart that takes a spare is charged the wait it may leave one of them "
        "(spares_free or more before the node it replaced is repaired); 0 prices none",
    )
    fault_quiet_s: Annotated[float, Field(ge=0)] = Field(
        default=600.0,
        description="CQE, counter and PCIe faults close after this long with the port ACTIVE "
        "and no new error (a link down closes on its port up, after the damping period)",
    )
    degraded_counter_limits: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(
            "symbol_error=10",
            "link_error_recovery=5",
            "link_downed=3",
            "port_rcv_errors=10",
            "excessive_buffer_overrun_errors=10",
        ),
        description="counter=N, comma-separated: a port whose counter rises by more than N "
        "within the degraded window opens a degraded fault (rebalanced, not failed over)",
    )
    degraded_window_s: Annotated[float, Field(gt=0, le=86400)] = Field(
        default=300.0, description="The window the degraded counter limits count over"
    )
    degraded_error_share: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.5,
        description="The bandwidth share a port over a counter limit is planned to carry "
        "(a port rate or PCIe link below its maximum counts what it measures)",
    )
    flap_max: Annotated[int, Field(ge=1)] = Field(
        default=4,
        description="More downs than this within the flap window: stay on the backup, flagged",
    )
    flap_window_s: Annotated[float, Field(gt=0)] = Field(
        default=600.0, description="Window over which a port's downs are counted"
    )
    correlation_window_s: Annotated[float, Field(gt=0)] = Field(
        default=2.0, description="Port faults on one fabric switch within this window are grouped"
    )
    correlation_min_nodes: Annotated[int, Field(ge=2)] = Field(
        default=3, description="Nodes with a fault on one switch in the window: a switch failure"
    )
    default_repair_s: Annotated[float, Field(gt=0)] = Field(
        default=86400.0,
        description="Repair time assumed for a failed RNIC or link at checkpoint re-decisions",
    )
    measured_k_min_samples: Annotated[int, Field(ge=2)] = Field(
        default=5,
        description="Iteration times needed on each side before a measured k is trusted",
    )
    measured_k_tolerance: Annotated[float, Field(gt=0)] = Field(
        default=0.02, description="A measured k this far (relative) from the one used re-decides"
    )
    nvl_mb_per_channel: Annotated[float, Field(gt=0)] = Field(
        default=40.0, description="GPU memory one NVL-transit channel costs, MB"
    )
    nvl_cap_mb: Annotated[float, Field(ge=0)] = Field(
        default=512.0, description="GPU memory a job may give to NVL transit, MB"
    )
    # A move to the backups is immediate, but a channel plan waits for its switch point,
    # and an unanswered command is retried command_max_attempts times (15 s x 3 by default).
    maintenance_lead_s: Annotated[float, Field(ge=0, le=86400)] = Field(
        default=60.0,
        description="Jobs on a planned maintenance's target move this long before its start "
        "(room for switch points and command retries)",
    )
    coordinator_interval_s: Annotated[float, Field(gt=0, le=60)] = Field(
        default=0.5, description="How often command retries and damped fail-backs are swept"
    )
    coordinator: bool = Field(
        default=True, description="Run the retry and fail-back sweeper in this replica"
    )
    # --- fleet notification (scheduler_svc.fleet) ---
    notify_secret: SecretStr | None = Field(
        default=None,
        description="Signs CloudEvents to jobs' notify_url; unset: a job with a notify_url "
        "is refused (422). Subscriptions carry their own secret",
    )
    webhook_timeout_s: Annotated[float, Field(gt=0, le=60)] = Field(
        default=10.0,
        description="Deadline of one webhook delivery attempt, in all (connect, send, answer)",
    )
    # Webhook URLs come from API callers: without these checks a subscription can make the
    # service post to its own loopback ports or a cloud metadata address (169.254.169.254),
    # and read the answers back through last_status (fleet/addresses.py).
    webhook_allow_loopback: bool = Field(
        default=False,
        description="Webhooks may go to loopback addresses (tests, one-machine demos); "
        "link-local, unspecified and multicast ones are always refused",
    )
    webhook_allow_private: bool = Field(
        default=True,
        description="Webhooks may go to private addresses (10/8, 172.16/12, 192.168/16, "
        "fc00::/7); false allows public addresses only",
    )
    webhook_max_attempts: Annotated[int, Field(ge=1, le=100)] = Field(
        default=12, description="Delivery attempts before an event is dead-lettered"
    )
    webhook_backoff_base_s: Annotated[float, Field(gt=0)] = Field(
        default=1.0, description="First retry delay; doubles per attempt"
    )
    webhook_backoff_max_s: Annotated[float, Field(gt=0)] = Field(
        default=600.0, description="Longest retry delay"
    )
    delivery_poll_s: Annotated[float, Field(gt=0, le=60)] = Field(
        default=1.0,
        description="Idle re-read of the outbox: how soon other replicas' events and due "
        "retries go out",
    )
    delivery_concurrency: Annotated[int, Field(ge=1, le=64)] = Field(
        default=4, description="Deliveries in flight at once per replica"
    )
    delivery_worker: bool = Field(
        default=True, description="Deliver webhooks and fleet actions from this replica"
    )
    k8s_enabled: bool = Field(
        default=False, description="Act on Kubernetes nodes (conditions, taints, cordon, events)"
    )
    k8s_api_url: str | None = Field(
        default=None,
        description="Kubernetes API URL; unset: in-cluster service account, else ~/.kube/config",
    )
    k8s_token_file: str | None = Field(
        default=None, description="Bearer token file for k8s_api_url"
    )
    # A cordon comes only with a restart decision (the job leaves the node); a failover
    # keeps its job there on the backup RNIC. A repair takes the taint and condition off
    # again and uncordons the node if Railover cordoned it.
    k8s_node_policy: Literal["condition", "taint", "cordon", "taint_and_cordon"] = Field(
        default="taint_and_cordon",
        description="What a node with a degraded RNIC gets beside its condition and an Event",
    )
    k8s_taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        default="NoSchedule", description="Effect of the taint on a failed node"
    )
    k8s_event_namespace: str = Field(
        default="default", description="Namespace of the Kubernetes events written"
    )
    slurm_enabled: bool = Field(
        default=False, description="Drain failed nodes and requeue restarting jobs in Slurm"
    )
    # Split like a shell line first, then each word is formatted: values never re-split.
    slurm_drain_command: str = Field(
        default='scontrol update NodeName={node} State=DRAIN Reason="{reason}"',
        description="Command that drains a node ({node}, {reason})",
    )
    slurm_requeue_command: str = Field(
        default="scontrol requeue {job_id}", description="Command that requeues a job ({job_id})"
    )
    slurm_scontrol: str = Field(
        default="scontrol",
        description="scontrol for the other Slurm steps: comment, resume, requeue without a "
        "node, and the reads that keep each step safe to repeat",
    )

    @field_validator("db_url")
    @classmethod
    def _store_url(cls, value: str) -> str:
        check_store_url(value)
        return value

    @field_validator("port", mode="before")
    @classmethod
    def _not_a_service_link(cls, value: object) -> object:
        # Kubernetes sets RAILOVER_PORT=tcp://IP:8080 for the Service named railover:
        # the Service's address, not this process's port.
        if isinstance(value, str) and SERVICE_LINK_VALUE.match(value.strip()):
            return DEFAULT_PORT
        return value

    @field_validator("default_k", mode="before")
    @classmethod
    def _k_list(cls, value: object) -> object:
        return parse_list(value)

    @field_validator("degraded_counter_limits", mode="before")
    @classmethod
    def _limit_list(cls, value: object) -> object:
        return parse_list(value)

    @field_validator("degraded_counter_limits")
    @classmethod
    def _limits(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            name, _, limit = item.partition("=")
            if not name.strip() or not limit.strip().isdigit():
                raise ValueError(f"degraded_counter_limits: {item!r} is not counter=N")
        return value

    def counter_limits(self) -> dict[str, int]:
        """degraded_counter_limits as counter -> the rise over the window that degrades."""
        return {
            n.strip(): int(x)
            for n, _, x in (i.partition("=") for i in self.degraded_counter_limits)
        }

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

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


# --- the settings reference (`railover config`, the README's table) -------------

BEGIN = "<!-- settings:begin (generated: python -m scheduler_svc.config README.md) -->"
END = "<!-- settings:end -->"


@dataclass(frozen=True)
class SettingDoc:
    variable: str
    type: str
    default: str
    meaning: str


def settings_classes() -> list[tuple[str, type[BaseSettings]]]:
    # Imported here: the agent's settings pull in its collectors, which `railover config`
    # alone needs.
    from agent.config import AgentSettings  # noqa: PLC0415

    return [("railover serve", Settings), ("railover-agent", AgentSettings)]


def describe(settings_cls: type[BaseSettings]) -> list[SettingDoc]:
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    return [
        SettingDoc(
            variable=prefix + name.upper(),
            type=_type_name(field),
            default=_default(field),
            meaning=field.description or "",
        )
        for name, field in settings_cls.model_fields.items()
    ]


def _type_name(field: FieldInfo) -> str:
    base = _annotation_name(field.annotation)
    bounds = []
    for meta in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(meta, attr, None)
            if isinstance(meta, annotated_types.BaseMetadata) and value is not None:
                bounds.append(f"{sign} {_bound(value, field)}")
    return f"{base} {', '.join(bounds)}" if bounds else base


def _bound(value: object, field: FieldInfo) -> str:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and extra.get("doc_octal") and isinstance(value, int):
        return oct(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _annotation_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is typing.Annotated:
        return _annotation_name(args[0])
    if origin in (typing.Union, types.UnionType):
        names = [_annotation_name(a) for a in args]
        return names[0] if len(names) == 1 else " or ".join(names)
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(annotation))
    if origin in (list, tuple):
        return f"list of {_annotation_name(args[0])}"
    if annotation is SecretStr:
        return "secret"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "doc_default" in extra:
        return str(extra["doc_default"])
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]  # no-argument factories
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return ",".join(_scalar(v) for v in value) if value else "none"
    return _scalar(value)


def _scalar(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def markdown() -> str:
    """The README's table: one per program."""
    out = []
    for program, cls in settings_classes():
        out += [
            f"`{program}`:",
            "",
            "| variable | type | default | meaning |",
            "| --- | --- | --- | --- |",
        ]
        out += [
            f"| `{d.variable}` | {d.type} | `{d.default}` | {d.meaning} |".replace("``", "(empty)")
            for d in describe(cls)
        ]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _cell(text: str) -> str:
    """Table-safe: a pipe would end the cell."""
    return text.replace("|", "\\|") if text else "(empty)"


def splice(readme: str) -> str:
    """The README with its generated section replaced by the current one."""
    head, sep, rest = readme.partition(BEGIN)
    if not sep or END not in rest:
        raise ValueError(f"README has no {BEGIN} ... {END} section")
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{markdown()}{END}{tail}"


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("README.md")
    path.write_text(splice(path.read_text()))
    print(f"wrote the settings table in {path}")


if __name__ == "__main__":
    main()
