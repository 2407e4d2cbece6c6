"""Liveness, readiness and Prometheus metrics at the root (not under /v1, not counted)."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from scheduler_svc import __version__
from scheduler_svc.api import routing
from scheduler_svc.api.deps import anonymous_open
from scheduler_svc.api.schemas.health import Health
from scheduler_svc.services import gauges
from scheduler_svc.store.db import probe_commit

router = routing.router(tags=["health"])


@router.get("/healthz", operation_id="healthz")
def healthz() -> Health:
    """The process is up, and which version it runs."""
    return Health(status="ok", detail={"version": __version__})


@router.get("/readyz", operation_id="readyz", responses={503: {"model": Health}})
def readyz(request: Request, response: Response) -> Health:
    """The store commits a write; the service can take traffic (503 when writes would)."""
    try:
        probe_commit(request.app.state.engine, request.app.state.settings.ready_probe_timeout_s)
    except Exception as exc:  # any store failure means not ready
        response.status_code = 503
        return Health(status="unavailable", detail={"store": str(exc).splitlines()[0]})
    return Health(status="ok", detail={"auth": "open" if anonymous_open(request) else "tokens"})


@router.get("/metrics", operation_id="metrics", include_in_schema=False)
async def prometheus_metrics(request: Request) -> Response:
    await run_in_threadpool(_refresh_gauges, request)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def _refresh_gauges(request: Request) -> None:
    """Gauges of stored state are read at scrape time, so every replica reports the truth."""
    try:
        with request.app.state.read_sessionmaker() as session:
            gauges.refresh(gauges.read_levels(session, datetime.now(UTC)))
            session.rollback()
    except Exception:  # noqa: S110  a scrape must not fail because the store is down
        pass
