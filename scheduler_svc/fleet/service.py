"""Wiring the fleet module into the app: the worker in the lifespan, the audit middleware."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fastapi import Request
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler_svc.config import Settings
from scheduler_svc.fleet import audit
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

    The entry is written in the transaction of the change it records where the route
    commits one (fleet/audit.py); otherwise when the answer starts, before the client sees
    any of it, apart from the request's own transaction so refused and failed calls are
    kept too (in one shared with other requests' short writes, store/groupcommit.py). The
    principal is the one deps.get_principal resolved for the request (none for a call that
    never got past authentication). A call that raises instead of answering (the outer
    error handler then answers 500) is not recorded. Every other request passes straight
    through: long-polls and reads cost nothing here.
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
        unwritten, token = audit.expect(Request(scope))

        async def audited(message: Message) -> None:
            if message["type"] == "http.response.start" and unwritten.status != message["status"]:
                await _audit(unwritten.request, message["status"])
            await send(message)

        try:
            await self.app(scope, receive, audited)
        finally:
            audit.done(token)


@dataclass
class RefusedTally:
    """Refused requests that never got past authentication, counted per minute, peer and
    status and written as one audit entry each (`count`): a flood of 401s wrote a row
    per request, 6,926 rows (5.7 MB) in 20 s. A minute's counts are written when a
    refusal of a later minute comes, or when the service stops."""

    minute: datetime | None = None
    counts: Counter[tuple[str, int]] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, at: datetime, client: str, status: int) -> list[m.AuditEntry]:
        """Count one; returns the entries of a minute that is over, to be written."""
        minute = at.replace(second=0, microsecond=0)
        with self.lock:
            done = self._take() if self.minute is not None and minute != self.minute else []
            self.minute = minute
            self.counts[(client, status)] += 1
        return done

    def flush(self) -> list[m.AuditEntry]:
        with self.lock:
            return self._take()

    def _take(self) -> list[m.AuditEntry]:
        minute, counts = self.minute, self.counts
        self.minute, self.counts = None, Counter()
        if minute is None:
            return []
        return [
            m.AuditEntry(
                at=minute,
                token_id=None,
                role=None,
                method="*",
                path="*",
                operation=None,
                status=status,
                client=client or None,
                detail=f"{n} state-changing requests without valid credentials refused "
                f"in the minute from {minute.isoformat()}",
                count=n,
            )
            for (client, status), n in counts.items()
        ]


async def _audit(request: Request, status: int) -> None:
    principal = getattr(request.state, "principal", None)
    tally: RefusedTally | None = getattr(request.app.state, "refused", None)
    if principal is None and status >= 400 and tally is not None:
        client = "" if request.client is None else request.client.host[:64]
        done = tally.add(datetime.now(UTC), client, status)
        if done:
            await _write_entries(request.app.state.writes, done)
        return
    entry = audit.entry(request, status)
    try:
        await run_in_threadpool(_write_audit, request.app.state.writes, entry)
    except Exception:  # an audit failure must not turn a done change into an error
        log.exception("could not write the audit entry for %s %s", request.method, entry.path)


def _write_audit(writes: GroupCommit, entry: m.AuditEntry) -> None:
    writes.run(lambda s: AuditRepo(s).add(entry))


async def _write_entries(writes: GroupCommit, entries: list[m.AuditEntry]) -> None:
    try:
        await run_in_threadpool(write_entries, writes, entries)
    except Exception:  # an audit failure must not turn a refusal into an error
        log.exception("could not write %d refused-request audit entries", len(entries))


def flush_refused(writes: GroupCommit, tally: RefusedTally) -> None:
    """The counts not yet written (the service stops): written now."""
    entries = tally.flush()
    if entries:
        try:
            write_entries(writes, entries)
        except Exception:
            log.exception("could not write %d refused-request audit entries", len(entries))


def write_entries(writes: GroupCommit, entries: list[m.AuditEntry]) -> None:
    def add(s: Session) -> None:
        for entry in entries:
            AuditRepo(s).add(entry)

    writes.run(add)
