"""The application factory: `scheduler_svc.main:create_app`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from types import FrameType

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler_svc import __version__, metrics
from scheduler_svc.api import (
    commands,
    docs,
    evaluate,
    events,
    fabric,
    faults,
    health,
    jobs,
    nodes,
    status,
)
from scheduler_svc.api import fleet as fleet_api
from scheduler_svc.api.deps import Principal
from scheduler_svc.api.error_handlers import LimitBody, document_errors, install_error_handlers
from scheduler_svc.api.token_cache import TokenCache, watch_token_writes
from scheduler_svc.config import Settings, get_settings
from scheduler_svc.fleet.service import AuditRequests, Fleet, RefusedTally, flush_refused
from scheduler_svc.services import gcpause
from scheduler_svc.services.delivery import (
    CommandListener,
    CommandNotifier,
    CommandWatermark,
    StreamSlots,
)
from scheduler_svc.services.passes import ReconcilePasses
from scheduler_svc.services.sweeps import Coordinator
from scheduler_svc.settings_env import is_loopback
from scheduler_svc.store import evidence_view
from scheduler_svc.store.db import (
    make_engine,
    make_read_sessionmaker,
    make_sessionmaker,
    upgrade,
)
from scheduler_svc.store.groupcommit import GroupCommit
from scheduler_svc.store.tokens import TokenRepo
from scheduler_svc.store.uow import Clock, system_clock

log = logging.getLogger("railover")
UNCOUNTED = {"/healthz", "/readyz", "/metrics"}


class RequestTiming:
    """ASGI middleware observing each request's latency, to the start of its answer, by
    method, route template and status; probes and scrapes are left out, and so is a
    request that raises instead of answering (the outer error handler answers it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                template = getattr(scope.get("route"), "path", "unmatched")
                metrics.REQUEST_LATENCY.labels(
                    scope["method"], template, str(message["status"])
                ).observe(time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, timed)


class PauseCollectorForLargeBodies:
    """ASGI middleware pausing the cyclic garbage collector (`gcpause`) for a request
    whose declared body is `min_bytes` or more, from its arrival to the end of its answer.

    A 65,536-rank job is 2.9 MB of JSON and becomes about half a million objects in
    FastAPI's body validation alone, before the route runs; with the collector on, they
    set off collections of the whole heap (validation took 0.38-0.50 s, 0.15 s paused).
    Held to the answer's end, the collection they are owed runs after the client has it.
    """

    def __init__(self, app: ASGIApp, min_bytes: int = 1 << 20) -> None:
        self.app = app
        self.min_bytes = min_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._large(scope):
            with gcpause.paused():
                await self.app(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _large(self, scope: Scope) -> bool:
        for key, value in scope["headers"]:  # names arrive lower-case (ASGI)
            if key == b"content-length":
                return value.isdigit() and int(value) >= self.min_bytes
        return False


class PollEndingServer(uvicorn.Server):
    """uvicorn's server, which also ends the waiting long-polls and the command streams
    when it is told to stop (SIGTERM, SIGINT): it waits for open requests, and those
    would hold it for up to RAILOVER_COMMANDS_WAIT_MAX_S, or a stream's whole
    RAILOVER_COMMANDS_STREAM_MAX_S (notify.CommandNotifier.close)."""

    def __init__(self, config: uvicorn.Config, notifier: CommandNotifier) -> None:
        super().__init__(config)
        self._notifier = notifier

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # The handler may have interrupted the event loop itself: close on its next turn.
        self._notifier.close_threadsafe()


def create_app(
    settings: Settings | None = None, *, migrate: bool = True, clock: Clock = system_clock
) -> FastAPI:
    """Build the service. The store is opened (and migrated) in the lifespan, not here."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if migrate:
            upgrade(settings.sqlalchemy_url)
        engine = make_engine(settings.sqlalchemy_url)
        app.state.engine = engine  # /readyz probes a commit on it
        if settings.evidence_in_memory:
            evidence_view.attach(engine)
        app.state.sessionmaker = make_sessionmaker(engine)
        app.state.read_sessionmaker = make_read_sessionmaker(engine)
        # Agents' reports and audit entries of concurrent requests commit together.
        app.state.writes = GroupCommit(app.state.sessionmaker, app.state.notifier.notify_threadsafe)
        # Token writes committed through this replica take effect at its next request.
        watch_token_writes(app.state.sessionmaker, app.state.token_cache.invalidate)
        # Anonymous access needs a loopback bind in the settings here, and then per
        # request a loopback connection and an empty token table (deps.get_principal),
        # so `uvicorn --host 0.0.0.0` and a first `railover token create` both close it.
        app.state.anonymous_allowed = settings.allow_anonymous_loopback and is_loopback(
            settings.host
        )
        with app.state.sessionmaker() as session:
            tokens = TokenRepo(session).count_active(datetime.now(UTC))
        if app.state.anonymous_allowed and tokens == 0:
            log.warning(
                "no API tokens exist: answering without authentication on %s; "
                "create tokens with `railover token create` to close it",
                settings.host,
            )
        elif tokens == 0:
            log.warning(
                "no API tokens exist: every request will be refused with 401. Create one: "
                "railover token create --role fleet (with this service's --db / "
                "RAILOVER_DB_URL); `railover serve --dev` answers loopback without one"
            )
        app.state.notifier.bind(asyncio.get_running_loop())
        # Commands other writers commit wake this replica's polls: through LISTEN on
        # PostgreSQL, through the newest command id, read once a second, on SQLite.
        listener: CommandListener | CommandWatermark
        if engine.dialect.name == "postgresql":
            listener = CommandListener(settings.sqlalchemy_url, app.state.notifier)
        else:
            listener = CommandWatermark(app.state.read_sessionmaker, app.state.notifier)
        listener.start()
        app.state.listener = listener
        # Outbox delivery runs in every replica; claims keep them off each other's rows.
        fleet = Fleet(app.state.sessionmaker, settings)
        fleet.start()
        # Command retries and fail-back after damping; safe in every replica.
        coordinator = Coordinator(
            app.state.sessionmaker,
            app.state.read_sessionmaker,
            settings,
            app.state.notifier,
            clock,
        )
        coordinator.start()
        app.state.coordinator = coordinator
        # Reports of one storm share their jobs' reconcile passes (services/passes.py).
        app.state.passes = ReconcilePasses(
            app.state.sessionmaker,
            settings,
            app.state.clock,
            app.state.notifier.notify_threadsafe,
        )
        try:
            yield
        finally:
            coordinator.stop()
            fleet.stop()
            listener.stop()
            flush_refused(app.state.writes, app.state.refused)
            engine.dispose()

    app = FastAPI(
        title="Railover",
        version=__version__,
        summary="Cluster-wide RDMA NIC failover decisions for GPU training jobs",
        lifespan=lifespan,
        docs_url=None,  # served by add_docs, from the package rather than a CDN
        redoc_url=None,
    )
    docs.add_docs(app)
    app.state.settings = settings
    app.state.clock = clock
    app.state.notifier = CommandNotifier()
    app.state.streams = StreamSlots(settings.commands_streams_per_node)
    app.state.anonymous_allowed = False
    app.state.refused = RefusedTally()
    app.state.token_cache = TokenCache[Principal](settings.auth_cache_s)
    # The routes as their routers built them at import, not `include_router`: an included
    # router's routes are built again for each app, at its first request (70 ms here),
    # and the twin, the demo and the tests make an app per run. The routers carry their
    # own prefixes and responses, and no lifespan.
    for module in (nodes, jobs, events, evaluate, commands, fabric, faults, health, status):
        app.router.routes.extend(module.router.routes)
    app.router.routes.extend(fleet_api.router.routes)
    # Pure ASGI middleware (no task or stream per request); each one added wraps those
    # before it, so a request meets the timing, then the body limit, then the audit.
    app.add_middleware(AuditRequests)

    install_error_handlers(app)
    document_errors(app)
    app.add_middleware(LimitBody, max_bytes=settings.max_body_bytes)
    app.add_middleware(PauseCollectorForLargeBodies)

    app.add_middleware(RequestTiming)

    return app
