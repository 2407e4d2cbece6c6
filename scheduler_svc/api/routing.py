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
the transaction's scope.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session

from scheduler_svc.store.uow import commit


def _commit_where_it_ran(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(endpoint)
    def run(*args: Any, **kwargs: Any) -> Any:
        result = endpoint(*args, **kwargs)
        session = kwargs.get("session")
        if isinstance(session, Session):
            commit(session)
        return result

    return run


class CommittingRoute(APIRoute):
    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        if not inspect.iscoroutinefunction(endpoint) and (
            "session" in inspect.signature(endpoint).parameters
        ):
            endpoint = _commit_where_it_ran(endpoint)
        super().__init__(path, endpoint, **kwargs)


def router(**kwargs: Any) -> APIRouter:
    """An APIRouter for this service (see the module docstring)."""
    return APIRouter(route_class=CommittingRoute, **kwargs)
