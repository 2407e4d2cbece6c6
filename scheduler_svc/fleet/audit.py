"""A state-changing request's audit entry, written in the transaction of the change it records.

The audit middleware (fleet/service.py, `AuditRequests`) marks each state-changing /v1
request as unwritten. A sync route that commits its own change (api/routing.py) adds the
entry to that commit, and an agent's report adds it to the group commit of its evidence
(api/events.py), so an acknowledgement or a report costs one transaction, not two (at a
switch point every node of the job sends one; in a leaf failure 64 nodes report). The
middleware writes the entry apart, as before, for every request whose route did not:
refused ones, async routes, and any whose answer's status is not the one recorded (a
commit that failed).
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass
from datetime import UTC, datetime

from fastapi import Request
from sqlalchemy.orm import Session

from scheduler_svc.fleet.repositories import AuditRepo
from scheduler_svc.store import models as m


@dataclass(slots=True)
class Unwritten:
    """The request being served; `status` is what its route's commit recorded, if any."""

    request: Request
    status: int | None = None


_UNWRITTEN: ContextVar[Unwritten | None] = ContextVar("railover_unwritten_audit", default=None)


def expect(request: Request) -> tuple[Unwritten, Token[Unwritten | None]]:
    """Mark the request as one to audit (the middleware, before the route runs)."""
    unwritten = Unwritten(request)
    return unwritten, _UNWRITTEN.set(unwritten)


def done(token: Token[Unwritten | None]) -> None:
    _UNWRITTEN.reset(token)


def pending() -> Unwritten | None:
    """The request being served, when it is one to audit whose entry no commit carried yet;
    None for a read or a call outside a request. Read in the request's own thread: a group
    commit (store/groupcommit.py) runs the request's write in another."""
    unwritten = _UNWRITTEN.get()
    return None if unwritten is None or unwritten.status is not None else unwritten


def add_to(session: Session, status: int) -> Unwritten | None:
    """Add the entry of the request being served to `session`, whose commit is its change.

    Returns the request's mark, for the caller to set `status` on once the commit is done;
    None when the request is not one to audit (a read, a call outside a request)."""
    unwritten = pending()
    if unwritten is not None:
        add(session, unwritten, status)
    return unwritten


def add(session: Session, unwritten: Unwritten, status: int) -> None:
    """Add the entry of the request `unwritten` marks to `session` (whose commit then
    carries it: set `unwritten.status` once it did)."""
    AuditRepo(session).add(entry(unwritten.request, status))


def entry(request: Request, status: int) -> m.AuditEntry:
    """The audit row of a request that got past authentication (its principal, if any)."""
    principal = getattr(request.state, "principal", None)
    route = request.scope.get("route")
    return m.AuditEntry(
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
