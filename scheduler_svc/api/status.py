"""The status page at / and the snapshot behind it at GET /v1/status.

The page is rendered on the server; a few lines of JavaScript re-fetch the live
part (/status/live, the same template) every few seconds. With tokens in the
store a browser has no bearer token on its first request, so the page asks for
a viewer token once, keeps it in sessionStorage and sends it with each refresh.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from scheduler_svc.api import routing
from scheduler_svc.deps import Reader, SessionDep, get_principal
from scheduler_svc.errors import Forbidden, Unauthorized, responses
from scheduler_svc.schemas import StatusOut
from scheduler_svc.services.status import build_status
from scheduler_svc.web.render import render_live, render_page

router = routing.router(tags=["status"])

# How often the page re-fetches its live part; shown on the page too.
REFRESH_S = 3

# The page itself never answers 401: a browser has no way to add a bearer token to it.
_optional_bearer = HTTPBearer(auto_error=False)
OptionalCreds = Annotated[HTTPAuthorizationCredentials | None, Depends(_optional_bearer)]


@router.get("/v1/status", operation_id="get_status", responses=responses(Unauthorized))
def get_status(session: SessionDep, _: Reader) -> StatusOut:
    """The cluster at a glance: rail health per node, open faults, jobs and latest decisions."""
    return build_status(session, datetime.now(UTC))


@router.get("/", include_in_schema=False, response_class=HTMLResponse)
def status_page(request: Request, session: SessionDep, creds: OptionalCreds) -> HTMLResponse:
    # Render the data at once when the caller may read it (open loopback service, or a
    # bearer header from a script); a browser facing a token-protected service gets
    # the page with a token prompt and the script fills it in.
    try:
        get_principal(request, creds)
        status: StatusOut | None = build_status(session, datetime.now(UTC))
    except (Unauthorized, Forbidden):
        status = None
    return HTMLResponse(render_page(status, REFRESH_S))


@router.get("/status/live", include_in_schema=False, response_class=HTMLResponse)
def status_live(session: SessionDep, _: Reader) -> HTMLResponse:
    return HTMLResponse(render_live(build_status(session, datetime.now(UTC))))
