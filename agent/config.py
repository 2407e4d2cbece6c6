"""The agent's settings: ``RAILOVER_AGENT_*`` variables, checked at start."""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agent.collectors import registered_names

DEFAULT_COUNTER_EVENTS = (
    "link_downed",
    "local_ack_timeout_err",
    "req_cqe_error",
    "resp_cqe_error",
    "rnr_nak_retry_err",
    "symbol_error",
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

    model_config = SettingsConfigDict(env_prefix="RAILOVER_AGENT_", extra="ignore")

    service_url: str = "http://127.0.0.1:8080"
    node_name: str = Field(default_factory=_default_node_name)
    token: SecretStr | None = None
    # Plain http to a non-loopback service would send the bearer token in the clear.
    allow_insecure_http: bool = False

    sysfs_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    rail_map: Path | None = None
    spool_dir: Path = Path("/var/lib/railover-agent")
    spool_max_events: int = Field(default=100_000, ge=100, le=10_000_000)
    socket: Path = Path("/run/railover/agent.sock")
    socket_mode: int = Field(default=0o660, ge=0, le=0o777)

    poll_interval_s: float = Field(default=1.0, ge=0.05, le=3600)
    topology_interval_s: float = Field(default=60.0, ge=1, le=86_400)
    # A collector's run that takes longer counts as failed (collector_success 0); each
    # collector has its own thread, so one stuck read delays no other collector.
    collector_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    metrics_host: str = "0.0.0.0"  # noqa: S104  # Prometheus scrapes the pod IP
    # 0 picks a free port (tests); the chosen one is logged.
    metrics_port: int = Field(default=9465, ge=0, le=65535)
    disabled_collectors: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Counters whose rise is reported as an event (names as the driver writes them).
    counter_events: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_COUNTER_EVENTS)
    )

    batch_max: int = Field(default=500, ge=1, le=1000)
    request_timeout_s: float = Field(default=5.0, gt=0, le=120)
    command_wait_s: float = Field(default=20.0, ge=0, le=300)
    retry_max_backoff_s: float = Field(default=30.0, gt=0, le=600)
    # How long a command waits for a matching plugin client before it is acked failed.
    command_hold_s: float = Field(default=30.0, ge=0, le=3600)

    @field_validator("disabled_collectors", "counter_events", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [p.strip() for p in v.split(",") if p.strip()]
        return v

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


def describe_errors(exc: Exception) -> str:
    """One line per problem, naming the variable, for the start-up refusal."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        var = f"RAILOVER_AGENT_{loc.upper()}" if loc else "settings"
        lines.append(f"{var}: {err['msg']}")
    return "\n".join(lines)
