"""Request dependencies, defined once as Annotated aliases and reused by every route."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from fastapi import BackgroundTasks, Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from scheduler_svc.api.schemas.tokens import Role
from scheduler_svc.api.token_cache import TokenCache
from scheduler_svc.config import Settings
from scheduler_svc.errors import Forbidden, Unauthorized, Unprocessable
from scheduler_svc.fleet import outbound
from scheduler_svc.services.passes import ReconcilePasses
from scheduler_svc.settings_env import is_loopback
from scheduler_svc.store.groupcommit import GroupCommit
from scheduler_svc.store.tokens import TokenRepo
from scheduler_svc.store.uow import answering, bind_notify, commit

log = logging.getLogger("railover")


async def get_session(request: Request, background: BackgroundTasks) -> AsyncIterator[Session]:
    """One session per request, the scope of its transaction: committed on success,
    rolled back on error.

    GET and HEAD requests read through the read-only sessionmaker, so on SQLite
    they never queue behind (or hold up) writers. Sync routes commit in their
    own worker thread (api/routing.py explains why); anything still open here
    is committed on the event loop, which needs no worker thread to do it. What the
    request's work left for after its answer (`uow.after_answer`) runs once the answer
    is sent, in a worker thread.
    """
    factory = (
        request.app.state.read_sessionmaker
        if request.method in ("GET", "HEAD")
        else request.app.state.sessionmaker
    )
    session: Session = factory()
    bind_notify(session, request.app.state.notifier.notify_threadsafe)
    background.add_task(_after_answer, answering(session))
    try:
        yield session
        if session.in_transaction():
            commit(session)
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


async def _after_answer(later: list[Callable[[], object]]) -> None:
    if later:
        await run_in_threadpool(_run_each, later)


def _run_each(later: list[Callable[[], object]]) -> None:
    while later:
        work = later.pop(0)
        try:
            work()
        except Exception:  # the answer is out: log it, and go on with the rest
            log.exception("work after the answer failed: %r", work)
        del work  # what it held (an evicted index) goes now, not with the next one


# scope="function": commit before the response goes out, so a 2xx means stored.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


# Every dependency is `async def`: FastAPI runs a plain `def` dependency in a worker
# thread, a hop (and a GIL hand-over) per dependency per request. Those that may read the
# store hand that read to a worker thread themselves (`get_principal`).


async def now(request: Request) -> datetime:
    """The request's time, from the app's clock (a dependency, so tests can set it)."""
    stamp: datetime = request.app.state.clock()
    return stamp


NowDep = Annotated[datetime, Depends(now)]


async def get_passes(request: Request) -> ReconcilePasses:
    passes: ReconcilePasses = request.app.state.passes
    return passes


PassesDep = Annotated[ReconcilePasses, Depends(get_passes)]


async def get_writes(request: Request) -> GroupCommit:
    writes: GroupCommit = request.app.state.writes
    return writes


# Short writes that concurrent requests commit together (store/groupcommit.py).
WritesDep = Annotated[GroupCommit, Depends(get_writes)]


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def check_webhook_url(field: str, url: str, settings: Settings) -> None:
    """A webhook URL whose host is a forbidden address is refused (422) naming the field;
    names are checked again after resolution, at each delivery (fleet/outbound.py)."""
    try:
        outbound.check_url(url, outbound.policy_of(settings))
    except ValueError as exc:
        raise Unprocessable(f"{field}: {exc}") from None


bearer_scheme = HTTPBearer(auto_error=False, description="Token from `railover token create`")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a token's id, role and (for agents) node; anonymous on open loopback."""

    token_id: str | None
    role: Role
    node: str | None = None

    def require_node(self, node: str) -> None:
        """Agents speak only for their own node; fleet tokens for any."""
        if self.role == Role.AGENT and self.node != node:
            raise Forbidden(f"agent token of node {self.node!r} cannot act for node {node!r}")


async def get_principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Principal:
    """Who is calling (`principal_of`): on the event loop when the token cache has the
    answer, as it has for every request of a known token within `auth_cache_s`; in a
    worker thread when the store must be read."""
    if _cache_answers(request, creds):
        return principal_of(request, creds)
    return await run_in_threadpool(principal_of, request, creds)


def _cache_answers(request: Request, creds: HTTPAuthorizationCredentials | None) -> bool:
    cache = token_cache(request)
    if creds is not None:
        return creds.scheme.lower() != "bearer" or cache.holds(creds.credentials)
    return not _may_be_anonymous(request) or cache.holds_any()


def principal_of(request: Request, creds: HTTPAuthorizationCredentials | None) -> Principal:
    """The principal the credentials name, or the anonymous fleet principal on open
    loopback; Unauthorized otherwise. Reads the store for what the token cache lacks."""
    if creds is not None:
        if creds.scheme.lower() != "bearer":
            raise Unauthorized("Authorization: expected 'Bearer <token>'")
        found = token_cache(request).token(
            creds.credentials, lambda: _read_token(request, creds.credentials)
        )
        if found is None:
            raise Unauthorized("Authorization: token unknown, revoked or expired")
        request.state.principal = found  # for the audit log (fleet.service.AuditRequests)
        return found
    if anonymous_open(request):
        anonymous = Principal(None, Role.FLEET)
        request.state.principal = anonymous
        return anonymous
    raise Unauthorized("Authorization: bearer token required")


def _loopback_peer(address: object) -> bool:
    host = address[0] if isinstance(address, (tuple, list)) and address else None
    return isinstance(host, str) and is_loopback(host)


def anonymous_open(request: Request) -> bool:
    """Whether this request may go without a token.

    Only when the app was configured for a loopback bind (main.py's lifespan), the
    connection itself is loopback at both ends (so an app served some other way on a
    routable address, `uvicorn --host 0.0.0.0` say, never answers a remote caller),
    and, read now rather than at start, no usable token exists: the first
    `railover token create` closes it within `auth_cache_s` (token_cache.py).
    """
    return _may_be_anonymous(request) and not token_cache(request).any_active(
        lambda: _read_any_active(request)
    )


def _may_be_anonymous(request: Request) -> bool:
    """`anonymous_open` but for the token table: a loopback app and connection."""
    return bool(getattr(request.app.state, "anonymous_allowed", False)) and (
        _loopback_peer(request.scope.get("client")) and _loopback_peer(request.scope.get("server"))
    )


def still_authorized(request: Request, principal: Principal) -> bool:
    """Whether the request's credentials still name `principal`: asked again while a
    command stream stays open (a revoked or expired token's stream ends). Through the
    token cache, so a revocation made through this replica counts at once, one made
    elsewhere within `auth_cache_s`; an expired token is never kept past its expiry."""
    if principal.token_id is None:
        return anonymous_open(request)
    scheme, _, plain = request.headers.get("authorization", "").partition(" ")
    plain = plain.strip()
    if scheme.lower() != "bearer" or not plain:
        return False
    found = token_cache(request).token(plain, lambda: _read_token(request, plain))
    return found is not None and found.token_id == principal.token_id


# What an app without one (a test's hand-built app) gets: every request reads the store.
_NO_CACHE: TokenCache[Principal] = TokenCache(0.0)


def token_cache(request: Request) -> TokenCache[Principal]:
    """The app's cache of token look-ups (scheduler_svc/api/token_cache.py)."""
    cache: TokenCache[Principal] = getattr(request.app.state, "token_cache", _NO_CACHE)
    return cache


def _read_token(request: Request, plain: str) -> tuple[Principal | None, datetime | None]:
    # Its own short read, not the request's session: a long-poll must not
    # hold a transaction (and SQLite's write lock) open while it waits.
    with request.app.state.read_sessionmaker() as session:
        token = TokenRepo(session).by_plain(plain, datetime.now(UTC))
        found = (
            (None, None)
            if token is None
            else (Principal(token.token_id, Role(token.role), token.node), token.expires_at)
        )
        session.rollback()
    return found


def _read_any_active(request: Request) -> bool:
    with request.app.state.read_sessionmaker() as session:
        taken = TokenRepo(session).any_active(datetime.now(UTC))
        session.rollback()
    return taken


def require(*roles: Role) -> Callable[[Principal], Coroutine[None, None, Principal]]:
    async def check(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if principal.role not in roles:
            allowed = ", ".join(r.value for r in roles)
            raise Forbidden(f"role {principal.role.value!r} cannot do this (needs: {allowed})")
        return principal

    return check


# Fleet-wide reads (every job, decision, command, the fabric): not an agent's. An agent
# token reads only what concerns its node (NodeReader routes check the node).
Reader = Annotated[Principal, Depends(require(Role.VIEWER, Role.FLEET))]
NodeReader = Annotated[Principal, Depends(require(Role.VIEWER, Role.FLEET, Role.AGENT))]
FleetAuth = Annotated[Principal, Depends(require(Role.FLEET))]
AgentAuth = Annotated[Principal, Depends(require(Role.AGENT, Role.FLEET))]
