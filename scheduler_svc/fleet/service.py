"""Wiring the fleet module into the app: the worker in the lifespan, the audit middleware."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from fastapi import Request
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler_svc.config import Settings
from scheduler_svc.fleet.events import CONFIG_KEY, FleetTargets
from scheduler_svc.fleet.repositories import AuditRepo
from scheduler_svc.fleet.worker import DeliveryWorker
from scheduler_svc.store import models as m
from scheduler_svc.store.groupcommit import GroupCommit

log = logging.getLogger("railover.fleet")
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Fleet:
    """What the lifespan starts and stops."""

    def __init__(self, sessions: sessionmaker[Session], settings: Settings) -> None:
        targets = FleetTargets(
            notify_signed=settings.notify_secret is not None,
            k8s=settings.k8s_enabled,
            slurm=settings.slurm_enabled,
        )
        # Every session of this app carries the targets, so `emit` knows them
        # without a global (tests run several differently configured apps).
        sessions.configure(info={CONFIG_KEY: targets})
        self.worker = DeliveryWorker(sessions, settings) if settings.delivery_worker else None

    def start(self) -> None:
        if self.worker is not None:
            self.worker.start()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()


class AuditRequests:
    """ASGI middleware recording every state-changing /v1 call, refused ones included.

    The entry is written when the answer starts, before the client sees any of it,
    apart from the request's own transaction so refused and failed calls are kept too
    (in one shared with other requests' short writes, store/groupcommit.py); the principal
    is the one deps.get_principal resolved for the request (none for a call that
    never got past authentication). A call that raises instead of answering (the
    outer error handler then answers 500) is not recorded. Every other request
    passes straight through: long-polls and reads cost nothing here.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in MUTATING
            or not scope["path"].startswith("/v1/")
        ):
            await self.app(scope, receive, send)
            return

        async def audited(message: Message) -> None:
            if message["type"] == "http.response.start":
                await _audit(Request(scope), message["status"])
            await send(message)

        await self.app(scope, receive, audited)


async def _audit(request: Request, status: int) -> None:
    principal = getattr(request.state, "principal", None)
    route = request.scope.get("route")
    entry = m.AuditEntry(
        at=datetime.now(UTC),
        token_id=getattr(principal, "token_id", None),
        role=None if principal is None else str(principal.role.value),
        method=request.method,
        path=request.url.path[:512],
        operation=getattr(route, "operation_id", None),
        status=status,
        client=None if request.client is None else request.client.host[:64],
        detail=getattr(request.state, "audit_detail", None),
    )
    try:
        await run_in_threadpool(_write_audit, request.app.state.writes, entry)
    except Exception:  # an audit failure must not turn a done change into an error
        log.exception("could not write the audit entry for %s %s", request.method, entry.path)


def _write_audit(writes: GroupCommit, entry: m.AuditEntry) -> None:
    writes.run(lambda s: AuditRepo(s).add(entry))
