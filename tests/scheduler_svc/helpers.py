"""Builders shared by the service tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from railover_testing.cluster_shapes import hgx_node
from railover_testing.local import local_app
from scheduler_svc.config import Settings
from scheduler_svc.store.uow import Clock, system_clock

CHECKPOINT = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def register_nodes(http: httpx.Client, names: list[str], **shape: Any) -> None:
    for n in names:
        r = http.put(f"/v1/nodes/{n}", json=hgx_node(**shape))
        assert r.status_code == 200, r.text


def job_body(job_id: str, nodes: list[str], gpus: int = 8, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "job_id": job_id,
        "ranks": [
            {"rank": i * gpus + g, "node": n, "gpu": g}
            for i, n in enumerate(nodes)
            for g in range(gpus)
        ],
        "checkpoint_interval_s": 3600,
        "reload_s": 600,
        "detect_s": 0,
        "timeout_s": 30,
        "last_checkpoint_at": CHECKPOINT.isoformat(),
        "slowdown_k": 1.5,
    }
    body.update(overrides)
    return body


def event(
    node: str,
    kind: str = "port_down",
    device: str | None = "mlx5_0",
    after_s: float = 0,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "event_id": extra.pop("event_id", str(uuid.uuid4())),
        "node": node,
        "kind": kind,
        "device": device,
        "port": 1,
        "observed_at": (CHECKPOINT + timedelta(seconds=after_s)).isoformat(),
        **extra,
    }


@dataclass(frozen=True, slots=True)
class Running:
    """One service a test started: a client for it, its base URL, its clock and settings."""

    http: httpx.Client
    url: str
    clock: Clock
    settings: Settings


# Each running service_factory service's coordinator sweep, by its port.
_SWEEPS: dict[int, Callable[[], object]] = {}


def sweep(http: httpx.Client) -> None:
    """One whole coordinator sweep of the service `http` talks to, run here at its clock:
    whatever the clock's deadlines make it do (close cleared faults, fail back, retry
    commands) is done when this returns, and an exception in it is raised here. The
    coordinator's own thread may sweep beside it, as another replica's would."""
    port = http.base_url.port
    assert port in _SWEEPS, f"no service_factory service listens on {http.base_url}"
    _SWEEPS[port]()


@contextmanager
def service_factory(db_url: str, **defaults: Any) -> Iterator[Callable[..., Running]]:
    """Start services on `db_url` with `defaults` (overridden per call, clock included);
    every one started is stopped when the block ends."""
    with ExitStack() as stack:

        def start(clock: Clock = system_clock, **overrides: Any) -> Running:
            settings = Settings(
                db_url=db_url,
                port=0,
                allow_anonymous_loopback=True,
                webhook_allow_loopback=True,
                **(defaults | overrides),
            )
            app, url = stack.enter_context(local_app(settings, clock=clock))
            port = app.state.settings.port
            _SWEEPS[port] = app.state.coordinator.sweep
            stack.callback(_SWEEPS.pop, port, None)
            http = stack.enter_context(httpx.Client(base_url=url, timeout=30))
            return Running(http, url, clock, settings)

        yield start
