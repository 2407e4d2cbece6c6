"""The agent's settings: ``RAILOVER_AGENT_*`` variables, checked at start."""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agent.collectors.names import registered_names

# A counter as a port's counters/, counters_ext/ or hw_counters/ names its file.
_COUNTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]{0,63}\Z")
MAX_COUNTER_EVENTS = 64
DEFAULT_COUNTER_EVENTS = (
    "link_downed",
    "local_ack_timeout_err",
    "req_cqe_error",
    "resp_cqe_error",
    "rnr_nak_retry_err",
    "symbol_error",
)
PREFIX = "RAILOVER_AGENT_"
# Kubernetes' docker-link variables for the Service named railover-agent (its
# RAILOVER_AGENT_SERVICE_HOST, RAILOVER_AGENT_PORT_9465_TCP, ...): not settings.
SERVICE_LINK = re.compile(
    r"^RAILOVER_AGENT_(?:SERVICE_HOST|SERVICE_PORT(?:_\w+)?|PORT|PORT_\d+_(?:TCP|UDP|SCTP)\w*)$"
)
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def _default_node_name() -> str:
    return socket.gethostname().split(".")[0]


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AgentSettings(BaseSettings):
    """Everything ``railover-agent`` needs; no command-line arguments."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore")

    service_url: str = Field(
        default="http://127.0.0.1:8080", description="The Railover service (https off loopback)"
    )
    node_name: str = Field(
        default_factory=_default_node_name,
        description="This node's name, as the jobs' rank placement names it",
        json_schema_extra={"doc_default": "short host name"},
    )
    token: SecretStr | None = Field(
        default=None,
        description="Agent token for this node (railover token create --role agent --node N); "
        "required off loopback",
    )
    # Plain http to a non-loopback service would send the bearer token in the clear.
    allow_insecure_http: bool = Field(
        default=False, description="Allow plain http to a service that is not on loopback"
    )

    sysfs_root: Path = Field(default=Path("/sys"), description="Where sysfs is mounted")
    proc_root: Path = Field(default=Path("/proc"), description="Where procfs is mounted")
    rail_map: Path | None = Field(
        default=None,
        description="YAML/JSON file naming each port's fabric switch and rail; sysfs cannot know",
    )
    spool_dir: Path = Field(
        default=Path("/var/lib/railover-agent"),
        description="Events wait here while the service is away (created at start)",
    )
    spool_max_events: int = Field(
        default=100_000, ge=100, le=10_000_000, description="Spooled events kept at most"
    )
    spool_max_dead_letters: int = Field(
        default=10_000,
        ge=10,
        le=1_000_000,
        description="Events the service refused kept for inspection at most (the oldest go)",
    )
    spool_max_quarantined: int = Field(
        default=1_000,
        ge=10,
        le=1_000_000,
        description="Unreadable spool rows kept in its quarantine table at most (the oldest go)",
    )
    socket: Path = Field(
        default=Path("/run/railover/agent.sock"),
        description="Unix socket the native plugin connects to (its directory is created)",
    )
    socket_mode: int = Field(
        default=0o660,
        ge=0,
        le=0o777,
        description="Permission bits of the plugin socket, octal (660 or 0o660)",
        json_schema_extra={"doc_default": "0o660", "doc_octal": True},
    )
    # Any local process in the socket's group may connect: these bound what one can hold.
    plugin_max_clients: int = Field(
        default=512, ge=1, le=65_536, description="Plugin connections open at once at most"
    )
    plugin_max_clients_per_process: int = Field(
        default=64,
        ge=1,
        le=65_536,
        description="Plugin connections one process (by its kernel pid) may hold at most",
    )
    plugin_hello_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="A plugin connection that sends no HELLO within this long is closed",
    )
    plugin_frame_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="A plugin connection that leaves a frame unfinished this long is closed",
    )
    plugin_max_communicators: int = Field(
        default=4096,
        ge=16,
        le=1_000_000,
        description="(job, communicator, rank) progress counts the node tracks at most; "
        "progress of others is dropped and counted",
    )
    plugin_max_communicators_per_client: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="(job, communicator, rank) progress counts one plugin connection may "
        "make the node track",
    )
    plugin_max_acks: int = Field(
        default=10_000,
        ge=100,
        le=1_000_000,
        description="Acks from plugin clients waiting for the service at most; beyond, "
        "new ones are dropped and counted",
    )

    poll_interval_s: float = Field(
        default=1.0, ge=0.05, le=3600, description="How often ports and counters are read"
    )
    topology_interval_s: float = Field(
        default=60.0, ge=1, le=86_400, description="How often the PCIe topology is re-read"
    )
    # Each collector has its own thread, so one stuck sysfs read delays no other collector.
    collector_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="A collector run taking longer counts as failed (collector_success 0)",
    )
    metrics_host: str = Field(
        default="0.0.0.0",  # noqa: S104  # Prometheus scrapes the pod IP
        description="Address of /healthz and /metrics",
    )
    # 0 picks a free port (tests); the chosen one is logged.
    metrics_port: int = Field(
        default=9465, ge=0, le=65535, description="Port of /healthz and /metrics (0: a free one)"
    )
    disabled_collectors: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Collectors not to run (comma list or JSON)",
        json_schema_extra={"doc_default": "none"},
    )
    # Counters whose rise is reported as an event (names as the driver writes them).
    counter_events: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_COUNTER_EVENTS),
        description="Counters whose rise is reported as an event (comma list or JSON, at "
        "most 64), looked up in counters/, counters_ext/ and hw_counters/; whether each can "
        "count on each port is registered and exported (railover_agent_port_statistic_available)",
    )

    batch_max: int = Field(default=500, ge=1, le=1000, description="Events sent per request")
    request_timeout_s: float = Field(
        default=5.0, gt=0, le=120, description="Timeout of one request to the service"
    )
    command_stream: bool = Field(
        default=True,
        description="Take commands on one stream that stays open (server-sent events); off, "
        "or against a service without the stream, long-poll for them",
    )
    command_heartbeat_s: float = Field(
        default=30.0,
        ge=1,
        le=300,
        description="Longest silence the command stream may keep: a stream quiet for longer "
        "(plus request_timeout_s) is taken as lost and opened again",
    )
    command_wait_s: float = Field(
        default=20.0, ge=0, le=300, description="Long-poll for commands, seconds"
    )
    retry_max_backoff_s: float = Field(
        default=30.0, gt=0, le=600, description="Longest wait between retries to the service"
    )
    command_hold_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="A command with no matching plugin client after this long is acked failed",
    )
    # Read before the settings (logging starts first); a field so it is listed and checked.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Log level of the agent"
    )

    @field_validator("disabled_collectors", "counter_events", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().startswith("["):
            try:
                return json.loads(v)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON list ({exc.msg}); or write it as a,b,c") from exc
        if isinstance(v, str):
            return [p.strip() for p in v.split(",") if p.strip()]
        return v

    @field_validator("counter_events")
    @classmethod
    def _counter_names(cls, v: list[str]) -> list[str]:
        # Each is a key of the registration's counters: a name the service refuses would
        # keep the whole node out.
        bad = [n for n in v if not _COUNTER_NAME.match(n)]
        if bad:
            raise ValueError(
                f"{', '.join(map(repr, bad))}: a counter name is letters, digits and '_' "
                "(at most 64), as the driver names the file"
            )
        if len(v) > MAX_COUNTER_EVENTS:
            raise ValueError(f"{len(v)} counters; at most {MAX_COUNTER_EVENTS}")
        return v

    @field_validator("socket_mode", mode="before")
    @classmethod
    def _octal(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                return int(v.strip(), 8)
            except ValueError:
                raise ValueError(f"{v!r} is not octal permission bits such as 660") from None
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v

    @field_validator("node_name")
    @classmethod
    def _node_name(cls, v: str) -> str:
        if not NODE_NAME_RE.match(v):
            raise ValueError(
                f"{v!r} is not a valid node name (letters, digits, '.', '_', '-'; max 253)"
            )
        return v

    @field_validator("service_url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{v!r} must be an http:// or https:// URL with a host")
        return v.rstrip("/")

    @field_validator("sysfs_root", "proc_root")
    @classmethod
    def _dir(cls, v: Path) -> Path:
        if not v.is_dir():
            raise ValueError(f"{v} is not a directory")
        return v

    @field_validator("rail_map")
    @classmethod
    def _rail_map(cls, v: Path | None) -> Path | None:
        if v is not None and not v.is_file():
            raise ValueError(f"rail map {v} does not exist")
        return v

    @model_validator(mode="after")
    def _safety(self) -> AgentSettings:
        unknown = sorted(set(self.disabled_collectors) - set(registered_names()))
        if unknown:
            raise ValueError(
                f"disabled_collectors names unknown collectors {unknown}; "
                f"known: {sorted(registered_names())}"
            )
        host = urlsplit(self.service_url).hostname or ""
        if (
            urlsplit(self.service_url).scheme == "http"
            and not is_loopback_host(host)
            and not self.allow_insecure_http
        ):
            raise ValueError(
                f"service_url {self.service_url} is plain http to a non-loopback host; "
                "use https or set RAILOVER_AGENT_ALLOW_INSECURE_HTTP=true"
            )
        if not is_loopback_host(host) and self.token is None:
            raise ValueError("token is required when the service is not on loopback")
        if self.command_wait_s + 5 > 300:
            raise ValueError("command_wait_s too long")
        return self

    def bearer(self) -> dict[str, str]:
        if self.token is None:
            return {}
        return {"Authorization": f"Bearer {self.token.get_secret_value()}"}


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each RAILOVER_AGENT_* variable that names no setting, with the nearest."""
    known = [PREFIX + name.upper() for name in AgentSettings.model_fields]
    warnings = []
    for name in sorted(environ):
        if not name.upper().startswith(PREFIX) or name.upper() in known:
            continue
        if SERVICE_LINK.match(name.upper()):
            continue
        # Matched without the shared prefix, which would make every name look alike.
        near = difflib.get_close_matches(
            name.upper().removeprefix(PREFIX), [k.removeprefix(PREFIX) for k in known], cutoff=0.7
        )
        hint = (
            f"; did you mean {PREFIX}{near[0]}?"
            if near
            else "; `railover config` lists every setting"
        )
        warnings.append(f"{name} is not a setting and is ignored{hint}")
    return warnings


def describe_errors(exc: Exception) -> str:
    """One line per problem, naming the variable, for the start-up refusal."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        var = f"RAILOVER_AGENT_{loc.upper()}" if loc else "settings"
        lines.append(f"{var}: {str(err['msg']).removeprefix('Value error, ')}")
    return "\n".join(lines)
