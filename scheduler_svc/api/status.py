"""The status page at / and the snapshot behind it at GET /v1/status.

The page is rendered on the server; a few lines of JavaScript re-fetch the live
part (/status/live, the same template) every few seconds. With tokens in the
store a browser has no bearer token on its first request, so the page asks for
a viewer token once, keeps it in sessionStorage and sends it with each refresh.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from scheduler_svc.api import routing
from scheduler_svc.api.deps import Reader, SessionDep, principal_of
from scheduler_svc.api.schemas.fields import RAIL_MAX, Label, Name
from scheduler_svc.api.schemas.status import StatusHealth, StatusOut
from scheduler_svc.errors import VALIDATION, Forbidden, Unauthorized, responses
from scheduler_svc.services.status import NODE_PAGE, NODE_PAGE_MAX, StatusQuery, build_status
from scheduler_svc.web.render import render_live, render_page

router = routing.router(tags=["status"])

# How often the page re-fetches its live part; shown on the page too.
REFRESH_S = 3

# The page itself never answers 401: a browser has no way to add a bearer token to it.
_optional_bearer = HTTPBearer(auto_error=False)
OptionalCreds = Annotated[HTTPAuthorizationCredentials | None, Depends(_optional_bearer)]


RailQuery = Annotated[
    int | None, Query(ge=0, le=RAIL_MAX, description="Only nodes' ports on this rail")
]
SwitchQuery = Annotated[Label | None, Query(description="Only nodes' ports on this switch")]
HealthQuery = Annotated[
    StatusHealth, Query(description="unhealthy: only nodes with a port that is not ok")
]
AfterNode = Annotated[
    Name | None, Query(description="Start after this node (the previous page's last)")
]
NodeLimit = Annotated[int, Query(ge=1, le=NODE_PAGE_MAX, description="Nodes per page")]


async def status_query(
    rail: RailQuery = None,
    switch: SwitchQuery = None,
    health: HealthQuery = "all",
    after_node: AfterNode = None,
    limit: NodeLimit = NODE_PAGE,
) -> StatusQuery:
    """The query of the snapshot, the same for the API, the page and its live part."""
    return StatusQuery(rail, switch, health, after_node, limit)


Params = Annotated[StatusQuery, Depends(status_query)]


@router.get(
    "/v1/status",
    operation_id="get_status",
    responses=responses(Unauthorized, Forbidden) | VALIDATION,
)
def get_status(session: SessionDep, _: Reader, params: Params) -> StatusOut:
    """The cluster at a glance: port health by rail and switch, a page of nodes, open
    faults, jobs and their latest decisions.

    The summaries cover the whole fabric; the nodes are a page of those matching
    rail, switch and health, by name (`next_after_node` names the next page).
    """
    return build_status(session, datetime.now(UTC), params)


@router.get("/", include_in_schema=False, response_class=HTMLResponse)
def status_page(
    request: Request, session: SessionDep, creds: OptionalCreds, params: Params
) -> HTMLResponse:
    # Render the data at once when the caller may read it (open loopback service, or a
    # bearer header from a script); a browser facing a token-protected service gets
    # the page with a token prompt and the script fills it in.
    try:
        principal_of(request, creds)
        status: StatusOut | None = build_status(session, datetime.now(UTC), params)
    except (Unauthorized, Forbidden):
        status = None
    return HTMLResponse(render_page(status, REFRESH_S, params))


@router.get("/status/live", include_in_schema=False, response_class=HTMLResponse)
def status_live(session: SessionDep, _: Reader, params: Params) -> HTMLResponse:
    return HTMLResponse(render_live(build_status(session, datetime.now(UTC), params), params))
