"""Request dependencies called directly (no HTTP): sessions, principals and roles.

Each runs against a real store (SQLite and PostgreSQL) and a real
CommandNotifier; only the request is built by hand, as Starlette builds it.
"""

from __future__ import annotations

import asyncio
import inspect
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, get_args

import pytest
from fastapi import BackgroundTasks
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials
from sqlalchemy import Engine
from starlette.requests import Request

from scheduler_svc.api import deps
from scheduler_svc.api.deps import Principal, get_principal, get_session, get_settings, require
from scheduler_svc.api.schemas.tokens import Role
from scheduler_svc.api.token_cache import TokenCache
from scheduler_svc.config import Settings
from scheduler_svc.errors import Forbidden, Unauthorized, Unprocessable
from scheduler_svc.main import create_app
from scheduler_svc.services.delivery import CommandNotifier
from scheduler_svc.store.db import make_read_sessionmaker, make_sessionmaker
from scheduler_svc.store.tokens import TokenRepo

NOW = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def app(engine: Engine, db_url: str) -> SimpleNamespace:
    return SimpleNamespace(
        state=SimpleNamespace(
            sessionmaker=make_sessionmaker(engine),
            read_sessionmaker=make_read_sessionmaker(engine),
            notifier=CommandNotifier(),
            anonymous_allowed=False,
            settings=Settings(db_url=db_url, port=0, allow_anonymous_loopback=True),
        )
    )


LOOPBACK = ("127.0.0.1", 8080)


def request(
    app: SimpleNamespace,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    client: tuple[str, int] = LOOPBACK,
) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": method, "path": "/", "headers": raw, "app": app}
    return Request({**scope, "client": client, "server": LOOPBACK})


def token_count(app: SimpleNamespace) -> int:
    with app.state.sessionmaker() as s:
        return TokenRepo(s).count_active(NOW)


async def finish(gen: Any, exc: BaseException | None = None) -> None:
    if exc is None:
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
    else:
        with pytest.raises(type(exc)):
            await gen.athrow(exc)


def test_a_writing_request_commits_on_success_and_wakes_pollers(app: SimpleNamespace) -> None:
    async def scenario() -> None:
        app.state.notifier.bind(asyncio.get_running_loop())
        gen = get_session(request(app, "POST"), BackgroundTasks())
        session = await gen.__anext__()
        assert session.get_bind().get_execution_options() == {}  # the writing sessionmaker
        TokenRepo(session).create(role="fleet", node=None, description="d", now=NOW)
        session.info["notify_nodes"] = ["n3"]
        waiter = asyncio.create_task(app.state.notifier.wait("n3", 30))
        await finish(gen)
        # The notify happened inside finish(): the waiter wakes without its 30 s timeout.
        await asyncio.wait_for(waiter, 10)
        assert not session.in_transaction()

    asyncio.run(scenario())
    assert token_count(app) == 1


def test_a_failing_request_rolls_back_and_notifies_nobody(app: SimpleNamespace) -> None:
    async def scenario() -> None:
        gen = get_session(request(app, "PUT"), BackgroundTasks())
        session = await gen.__anext__()
        TokenRepo(session).create(role="fleet", node=None, description="d", now=NOW)
        session.flush()
        session.info["notify_nodes"] = ["n3"]
        await finish(gen, RuntimeError("route failed"))
        assert not app.state.notifier._event("n3").is_set()

    asyncio.run(scenario())
    assert token_count(app) == 0


def test_reads_use_the_read_only_sessionmaker(app: SimpleNamespace) -> None:
    async def scenario(method: str) -> dict[str, Any]:
        gen = get_session(request(app, method), BackgroundTasks())
        session = await gen.__anext__()
        options = dict(session.get_bind().get_execution_options())
        await finish(gen)
        return options

    assert asyncio.run(scenario("GET")) == {"railover_read_only": True}
    assert asyncio.run(scenario("HEAD")) == {"railover_read_only": True}
    assert asyncio.run(scenario("DELETE")) == {}


def test_settings_come_from_the_app(app: SimpleNamespace) -> None:
    assert asyncio.run(get_settings(request(app))) is app.state.settings


def bearer(token: str, scheme: str = "Bearer") -> HTTPAuthorizationCredentials:
    return HTTPAuthorizationCredentials(scheme=scheme, credentials=token)


def principal(req: Request, creds: HTTPAuthorizationCredentials | None) -> Principal:
    """The dependency as FastAPI awaits it."""
    return asyncio.run(get_principal(req, creds))


def test_principal_from_a_token(app: SimpleNamespace) -> None:
    with app.state.sessionmaker() as s:
        row, plain = TokenRepo(s).create(role="agent", node="n0", description="", now=NOW)
        token_id = row.token_id
        s.commit()
    req = request(app)
    who = principal(req, bearer(plain, "bearer"))  # the scheme is case-insensitive
    assert who == Principal(token_id, Role.AGENT, "n0")
    assert req.state.principal == who


@pytest.mark.parametrize(
    ("creds", "anonymous", "message"),
    [
        (bearer("x", "Basic"), False, "Authorization: expected 'Bearer <token>'"),
        (bearer("rvr_unknown"), True, "Authorization: token unknown, revoked or expired"),
        (None, False, "Authorization: bearer token required"),
    ],
)
def test_principal_refusals(
    app: SimpleNamespace, creds: HTTPAuthorizationCredentials | None, anonymous: bool, message: str
) -> None:
    app.state.anonymous_allowed = anonymous
    req = request(app)
    with pytest.raises(Unauthorized) as info:
        principal(req, creds)
    assert info.value.detail == message
    assert not hasattr(req.state, "principal")


def test_revoked_token_is_refused(app: SimpleNamespace) -> None:
    with app.state.sessionmaker() as s:
        row, plain = TokenRepo(s).create(role="fleet", node=None, description="", now=NOW)
        TokenRepo(s).revoke(row.token_id, NOW)
        s.commit()
    with pytest.raises(Unauthorized, match="unknown, revoked or expired"):
        principal(request(app), bearer(plain))


def test_anonymous_loopback_is_a_fleet_principal(app: SimpleNamespace) -> None:
    app.state.anonymous_allowed = True
    req = request(app)
    assert principal(req, None) == Principal(None, Role.FLEET, None)
    assert req.state.principal == Principal(None, Role.FLEET)
    # A caller from a routable address gets no such principal.
    with pytest.raises(Unauthorized, match="bearer token required"):
        principal(request(app, client=("10.0.0.9", 40000)), None)
    # Nor does anyone once a usable token exists.
    with app.state.sessionmaker() as s:
        TokenRepo(s).create(role="fleet", node=None, description="", now=NOW)
        s.commit()
    with pytest.raises(Unauthorized, match="bearer token required"):
        principal(request(app), None)


def test_missing_header_is_left_to_get_principal(app: SimpleNamespace) -> None:
    """The bearer scheme never answers by itself: get_principal words every refusal."""
    assert asyncio.run(deps.bearer_scheme(request(app))) is None
    assert deps.bearer_scheme.model.description == "Token from `railover token create`"


def test_require_names_the_roles_it_needs() -> None:
    check = require(Role.FLEET, Role.AGENT)
    agent = Principal("t1", Role.AGENT, "n0")
    assert asyncio.run(check(agent)) is agent
    with pytest.raises(Forbidden) as info:
        asyncio.run(check(Principal("t2", Role.VIEWER)))
    assert info.value.detail == "role 'viewer' cannot do this (needs: fleet, agent)"


@pytest.mark.parametrize(
    ("alias", "allowed"),
    [
        (deps.Reader, {Role.VIEWER, Role.FLEET}),
        (deps.NodeReader, {Role.VIEWER, Role.FLEET, Role.AGENT}),
        (deps.FleetAuth, {Role.FLEET}),
        (deps.AgentAuth, {Role.AGENT, Role.FLEET}),
    ],
)
def test_each_alias_admits_its_roles(alias: Any, allowed: set[Role]) -> None:
    check = get_args(alias)[1].dependency
    for role in Role:
        who = Principal("t", role, "n0")
        if role in allowed:
            assert asyncio.run(check(who)) is who
        else:
            with pytest.raises(Forbidden):
                asyncio.run(check(who))


def test_agents_speak_only_for_their_node() -> None:
    Principal("t", Role.AGENT, "n0").require_node("n0")
    Principal("t", Role.FLEET).require_node("n7")
    Principal("t", Role.VIEWER).require_node("n7")
    with pytest.raises(Forbidden) as info:
        Principal("t", Role.AGENT, "n0").require_node("n1")
    assert info.value.detail == "agent token of node 'n0' cannot act for node 'n1'"


def test_a_principal_is_still_authorized_only_while_its_own_token_works(
    app: SimpleNamespace,
) -> None:
    """What an open command stream asks again at each heartbeat (deps.still_authorized)."""
    with app.state.sessionmaker() as s:
        row, plain = TokenRepo(s).create(role="agent", node="n0", description="", now=NOW)
        other, other_plain = TokenRepo(s).create(role="agent", node="n1", description="", now=NOW)
        s.commit()
    who = Principal(row.token_id, Role.AGENT, "n0")
    assert deps.still_authorized(request(app, headers={"Authorization": f"Bearer {plain}"}), who)
    assert deps.still_authorized(request(app, headers={"Authorization": f"bearer  {plain} "}), who)
    # Another token, another scheme, none at all: not this principal.
    for header in (f"Bearer {other_plain}", f"Basic {plain}", "Bearer ", ""):
        req = request(app, headers={"Authorization": header} if header else None)
        assert not deps.still_authorized(req, who), header
    with app.state.sessionmaker() as s:
        TokenRepo(s).revoke(row.token_id, NOW)
        s.commit()
    assert not deps.still_authorized(
        request(app, headers={"Authorization": f"Bearer {plain}"}), who
    )
    assert other.token_id != row.token_id


def test_an_anonymous_principal_is_still_authorized_only_while_access_stays_open(
    app: SimpleNamespace,
) -> None:
    anonymous = Principal(None, Role.FLEET)
    app.state.anonymous_allowed = True
    assert deps.still_authorized(request(app), anonymous)
    app.state.anonymous_allowed = False
    assert not deps.still_authorized(request(app), anonymous)


@pytest.mark.parametrize(
    ("url", "allowed", "refusal"),
    [
        ("http://127.0.0.1:9/h", False, "notify_url: http://127.0.0.1:9/h: loopback addresses"),
        ("http://127.0.0.1:9/h", True, None),
        (
            "http://u:pw@169.254.169.254/",
            True,
            "notify_url: http://***@169.254.169.254/: link-local",
        ),
        ("https://hooks.example/h", False, None),
    ],
)
def test_webhook_urls_are_checked_against_the_settings(
    db_url: str, url: str, allowed: bool, refusal: str | None
) -> None:
    settings = Settings(db_url=db_url, webhook_allow_loopback=allowed)
    if refusal is None:
        deps.check_webhook_url("notify_url", url, settings)
        return
    with pytest.raises(Unprocessable) as info:
        deps.check_webhook_url("notify_url", url, settings)
    assert str(info.value.detail).startswith(refusal)


def test_still_authorized_looks_each_token_up_by_itself_through_a_warm_cache(
    app: SimpleNamespace,
) -> None:
    """With the app's token cache on, one principal's answer is never another's."""
    app.state.token_cache = TokenCache[Principal](60.0)
    with app.state.sessionmaker() as s:
        rows = [TokenRepo(s).create(role="agent", node=n, description="", now=NOW) for n in "ab"]
        s.commit()
    for row, plain in rows:
        who = Principal(row.token_id, Role.AGENT, row.node)
        assert deps.still_authorized(
            request(app, headers={"Authorization": f"Bearer {plain}"}), who
        )


def test_anonymous_access_is_closed_unless_the_app_says_it_is_open(app: SimpleNamespace) -> None:
    """An app built some other way (no anonymous_allowed at all) is closed; so is a
    connection whose peer the server could not name."""
    del app.state.anonymous_allowed
    with pytest.raises(Unauthorized, match="bearer token required"):
        principal(request(app), None)
    app.state.anonymous_allowed = True
    for peer in (None, ()):
        req = Request({**request(app).scope, "client": peer})
        assert not deps.anonymous_open(req)


def test_a_warm_token_cache_answers_each_token_for_itself_and_keeps_it_its_time(
    app: SimpleNamespace,
) -> None:
    """get_principal through the app's cache: each token its own principal, and a token
    revoked elsewhere (not through this app) still answers until the cache lets it go."""
    app.state.token_cache = TokenCache[Principal](60.0)
    with app.state.sessionmaker() as s:
        rows = [TokenRepo(s).create(role="agent", node=n, description="", now=NOW) for n in "ab"]
        s.commit()
    for row, plain in rows:
        assert principal(request(app), bearer(plain)).token_id == row.token_id
    (first, plain), _ = rows
    with app.state.sessionmaker() as s:
        TokenRepo(s).revoke(first.token_id, NOW)
        s.commit()
    assert principal(request(app), bearer(plain)).token_id == first.token_id
    app.state.token_cache.invalidate()
    with pytest.raises(Unauthorized, match="unknown, revoked or expired"):
        principal(request(app), bearer(plain))


def test_the_app_state_dependencies_hand_out_the_apps_own_parts(app: SimpleNamespace) -> None:
    app.state.clock = lambda: NOW
    app.state.passes, app.state.writes = object(), object()
    req = request(app)
    assert asyncio.run(deps.now(req)) == NOW
    assert asyncio.run(deps.get_passes(req)) is app.state.passes
    assert asyncio.run(deps.get_writes(req)) is app.state.writes


def test_no_dependency_of_any_route_takes_a_worker_thread(tmp_path: Any) -> None:
    """FastAPI runs a `def` dependency in a worker thread: a hop and a GIL hand-over per
    dependency per request (an acknowledgement took four before its own). Every route's
    dependencies are `async def`; a store read is handed to a thread by the dependency
    itself, only when it is needed (below)."""
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'r.db'}", port=0), migrate=False)

    def inline(call: Any) -> bool:
        return (
            inspect.iscoroutinefunction(call)
            or inspect.isasyncgenfunction(call)
            or inspect.iscoroutinefunction(type(call).__call__)  # HTTPBearer and kin
        )

    seen: set[str] = set()
    threaded: set[str] = set()

    def walk(dependant: Dependant) -> None:
        for sub in dependant.dependencies:
            if sub.call is not None:
                name = getattr(sub.call, "__name__", type(sub.call).__name__)
                seen.add(name)
                if not inline(sub.call):
                    threaded.add(name)
            walk(sub)

    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    for route in routes:
        walk(route.dependant)
    assert threaded == set()
    assert {"get_principal", "check", "get_session", "now", "HTTPBearer"} <= seen
    assert len(routes) > 30


def test_the_principal_takes_a_worker_thread_only_to_read_the_store(
    app: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token the cache holds, and anonymous access the cache has an answer for, are
    answered on the event loop; the first sight of each reads the store in a thread."""
    hops: list[str] = []

    async def counted(func: Any, *args: Any) -> Any:
        hops.append(func.__name__)
        return func(*args)

    monkeypatch.setattr(deps, "run_in_threadpool", counted)
    app.state.token_cache = TokenCache[Principal](60.0)
    with app.state.sessionmaker() as s:
        row, plain = TokenRepo(s).create(role="agent", node="n0", description="", now=NOW)
        s.commit()
    want = Principal(row.token_id, Role.AGENT, "n0")
    assert [principal(request(app), bearer(plain)) for _ in range(3)] == [want] * 3
    assert hops == ["principal_of"]
    # Refusals that need no read: no hop.
    with pytest.raises(Unauthorized, match="expected 'Bearer"):
        principal(request(app), bearer(plain, "Basic"))
    with pytest.raises(Unauthorized, match="bearer token required"):
        principal(request(app, client=("10.0.0.9", 40000)), None)
    assert hops == ["principal_of"]
    # Anonymous loopback: one read of whether a token exists, then the cache's answer.
    app.state.anonymous_allowed = True
    for _ in range(2):
        with pytest.raises(Unauthorized, match="bearer token required"):
            principal(request(app), None)
    assert hops == ["principal_of"] * 2
    # A token the cache does not hold (another, or after the cache was emptied): a read.
    app.state.token_cache.invalidate()
    assert principal(request(app), bearer(plain)) == want
    with pytest.raises(Unauthorized, match="unknown, revoked or expired"):
        principal(request(app), bearer("rvr_unknown"))
    assert hops == ["principal_of"] * 4
    # With the cache off, every request reads.
    app.state.token_cache = TokenCache[Principal](0.0)
    principal(request(app), bearer(plain))
    assert len(hops) == 5


def test_the_cache_holds_an_answer_exactly_as_long_as_it_gives_it_without_a_read() -> None:
    """`holds` and `holds_any` agree with `token` and `any_active` at the expiry instant:
    a request the loop answers from the cache must not turn into a store read there."""
    t = [100.0]
    cache = TokenCache[str](10.0, clock=lambda: t[0])
    reads: list[str] = []

    def read() -> tuple[str | None, datetime | None]:
        reads.append("token")
        return "p", None

    def read_any() -> bool:
        reads.append("any")
        return True

    assert not cache.holds("rvr_x") and not cache.holds_any()
    assert cache.token("rvr_x", read) == "p" and cache.any_active(read_any)
    for at, held in ((109.999, True), (110.0, False)):
        t[0] = at
        assert (cache.holds("rvr_x"), cache.holds_any()) == (held, held)
        before = len(reads)
        cache.token("rvr_x", read), cache.any_active(read_any)
        assert len(reads) - before == (0 if held else 2)
    assert not cache.holds("rvr_other")
    off = TokenCache[str](0.0)
    off.token("rvr_x", read), off.any_active(read_any)
    assert not off.holds("rvr_x") and not off.holds_any()
