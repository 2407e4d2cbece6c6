"""Routers whose sync routes commit in the worker thread that did the work.

A sync route runs in one worker thread, and FastAPI then needs further
worker-thread hops (response validation) before a dependency's teardown
runs. If the request's transaction were committed in that teardown, the
database's write lock (SQLite's BEGIN IMMEDIATE, PostgreSQL row locks) would
be held across those hops; with every worker thread waiting for the same
lock, the holder could never get a thread to finish on, and all of them
would wait out the lock timeout. Seen under a 64-node fault storm.

So a sync route that takes the request session (`session: SessionDep`)
commits right where it returns, in its own thread; `deps.get_session`
still rolls back on error and closes, and stays the one place that defines
the transaction's scope. The request's audit entry, if it is a write, goes into
the same commit (fleet/audit.py).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Response
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session

from scheduler_svc.fleet import audit
from scheduler_svc.store.uow import commit


def _commit_where_it_ran(endpoint: Callable[..., Any], status_code: int) -> Callable[..., Any]:
    @functools.wraps(endpoint)
    def run(*args: Any, **kwargs: Any) -> Any:
        result = endpoint(*args, **kwargs)
        session = kwargs.get("session")
        if isinstance(session, Session):
            status = answering_status(result, kwargs.get("response"), status_code)
            unwritten = audit.add_to(session, status)  # the request's audit entry, one commit
            commit(session)
            if unwritten is not None:
                unwritten.status = status
        return result

    return run


def answering_status(result: Any, response: Any, default: int) -> int:
    """The status the route answers with: a Response it returned, one it set on its
    `response` parameter, or its declared one."""
    if isinstance(result, Response):
        return result.status_code
    if isinstance(response, Response) and response.status_code is not None:
        return response.status_code
    return default


class CommittingRoute(APIRoute):
    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        if not inspect.iscoroutinefunction(endpoint) and (
            "session" in inspect.signature(endpoint).parameters
        ):
            endpoint = _commit_where_it_ran(endpoint, kwargs.get("status_code") or 200)
        super().__init__(path, endpoint, **kwargs)


def router(**kwargs: Any) -> APIRouter:
    """An APIRouter for this service (see the module docstring)."""
    return APIRouter(route_class=CommittingRoute, **kwargs)
