"""`railover`: run the service, manage tokens, plan with the tools.

Expected failures (a bad setting or store URL, a store that cannot be reached, a port
in use, an output path that cannot be written) end in one or two lines on stderr,
the problem and then its fix, and exit status 2. A traceback means a bug, or that
`--debug` was given.
"""

from __future__ import annotations

import errno
import logging
import socket
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from scheduler_svc import __version__, errors
from scheduler_svc.api.schemas.tokens import Role
from scheduler_svc.config import Settings, service_variable_warnings
from scheduler_svc.errors import refuse
from scheduler_svc.planning import cli as planning_cli
from scheduler_svc.settings_env import describe_errors, is_loopback, sqlite_path
from scheduler_svc.twin import cli as twin_cli

app = typer.Typer(
    name="railover",
    help="Railover: cluster-wide RDMA NIC failover decisions for GPU training jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
token_app = typer.Typer(help="Create, list and revoke API tokens.", no_args_is_help=True)
db_app = typer.Typer(help="Store maintenance.", no_args_is_help=True)
twin_cli.register(app)
app.add_typer(token_app, name="token")
app.add_typer(db_app, name="db")
planning_cli.register(app)

_store_shown = "(as given)"
# The flags that set a setting, so an error names what the user typed.
FLAGS = {"db_url": "--db", "host": "--host", "port": "--port"}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"railover {__version__}")
        raise typer.Exit


@app.callback()
def _main(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks for the failures explained in a line.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    errors.debug = debug


DbOpt = Annotated[
    str | None,
    typer.Option("--db", help="SQLAlchemy URL (default: RAILOVER_DB_URL or sqlite:///railover.db)"),
]


def _settings(db: str | None = None, **overrides: object) -> Settings:
    values = {k: v for k, v in overrides.items() if v is not None}
    if db is not None:
        values["db_url"] = db
    for warning in service_variable_warnings():
        typer.echo(f"railover: warning: {warning}", err=True)
    try:
        settings = Settings(**values)  # type: ignore[arg-type]  # validated by pydantic
    except ValidationError as exc:
        lines = describe_errors(exc, Settings)
        for field, flag in FLAGS.items():
            var = f"RAILOVER_{field.upper()}"
            lines = [f"{flag}/{line}" if line.startswith(var) else line for line in lines]
        refuse("; ".join(lines), "`railover config` lists every setting with its type and default")
    store_file = sqlite_path(settings.db_url) if settings.db_url.startswith("sqlite") else None
    if store_file is not None and not store_file.parent.is_dir():
        refuse(
            f"the folder {store_file.parent} for the SQLite store {store_file} does not exist",
            f"create it (mkdir -p {store_file.parent}) or give another --db / RAILOVER_DB_URL",
        )
    global _store_shown  # noqa: PLW0603  # named by the error a failing store raises later
    _store_shown = _without_password(settings.db_url)
    return settings


def _without_password(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL is refused when it is used; show none of it
        return "(as given)"


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Address to listen on [127.0.0.1]")] = None,
    port: Annotated[int | None, typer.Option(help="Port [8080]")] = None,
    db: DbOpt = None,
    dev: Annotated[
        bool,
        typer.Option(
            "--dev",
            help="Development: on loopback, answer without a token while none exists "
            "(RAILOVER_ALLOW_ANONYMOUS_LOOPBACK=true).",
        ),
    ] = False,
) -> None:
    """Run the service (migrates the store first)."""
    settings = _settings(db, host=host, port=port, allow_anonymous_loopback=dev or None)
    # Bound (not yet listening) before the store is touched: a port in use is said first.
    listener = _bind(settings.host, settings.port)
    # The service (FastAPI, SQLAlchemy, the app: a second of imports) loads once the
    # settings and the port are known good, so a mistake in them is said at once.
    from scheduler_svc.main import PollEndingServer, create_app
    from scheduler_svc.serving import raise_fd_limit, server_config
    from scheduler_svc.store.db import make_engine, make_sessionmaker, upgrade
    from scheduler_svc.store.tokens import TokenRepo

    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(message)s")
    upgrade(settings.sqlalchemy_url)
    engine = make_engine(settings.sqlalchemy_url)
    with make_sessionmaker(engine)() as session:
        tokens = TokenRepo(session).count_active(datetime.now(UTC))
    engine.dispose()
    if not is_loopback(settings.host) and tokens == 0:
        typer.echo(
            f"refusing to listen on {settings.host}: no API tokens exist, so anyone could "
            "change decisions. Create them first: railover token create --role fleet",
            err=True,
        )
        raise typer.Exit(2)
    if not is_loopback(settings.host):
        settings = settings.model_copy(update={"allow_anonymous_loopback": False})
    app = create_app(settings, migrate=False)
    raise_fd_limit(settings)
    config = server_config(
        app, settings, host=settings.host, port=settings.port, log_level=settings.log_level.lower()
    )
    # uvicorn says where it listens only for sockets it bound itself.
    bound_host, bound_port = listener.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    logging.getLogger("railover").info(
        "railover %s on http://%s:%d/ (status page; API docs at /docs)",
        __version__,
        shown,
        bound_port,
    )
    PollEndingServer(config, app.state.notifier).run(sockets=[listener])


def _bind(host: str, port: int) -> socket.socket:
    """The service's socket, bound but not listening (uvicorn listens on it).

    Binding here rather than in uvicorn says a port in use in two lines, not a traceback.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except socket.gaierror as exc:
        refuse(
            f"cannot listen on {host}: {exc.strerror}",
            "give an address of this machine: --host or RAILOVER_HOST (127.0.0.1, 0.0.0.0)",
        )
    try:
        # As uvicorn would: a port left in TIME_WAIT by a previous run is not "in use".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        return sock
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            refuse(
                f"port {port} on {host} is in use by another program",
                "stop it, or choose another port: --port N or RAILOVER_PORT",
            )
        if exc.errno == errno.EACCES:
            refuse(
                f"no permission to listen on port {port}",
                "use a port above 1023: --port N or RAILOVER_PORT",
            )
        refuse(
            f"cannot listen on {host}:{port}: {exc.strerror}",
            "give an address of this machine: --host or RAILOVER_HOST (127.0.0.1, 0.0.0.0)",
        )


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> timedelta | None:
    """'3600', '90m', '12h', '30d' as a positive duration of at most ten years."""
    text = text.strip().lower()
    unit = _UNITS.get(text[-1:])
    number = text[:-1] if unit is not None else text
    if not number.isdigit():
        return None
    seconds = int(number) * (unit or 1)
    return timedelta(seconds=seconds) if 0 < seconds <= 3650 * 86400 else None


@token_app.command("create")
def token_create(
    role: Annotated[Role, typer.Option(help="agent (one node), fleet (read/write) or viewer")],
    node: Annotated[str | None, typer.Option(help="The node an agent token speaks for")] = None,
    description: Annotated[str, typer.Option(help="Free text kept with the token")] = "",
    expires_in: Annotated[
        str | None,
        typer.Option(help="Stop working after this long: 3600, 90m, 12h or 30d; unset: never"),
    ] = None,
    db: DbOpt = None,
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    from scheduler_svc.store.db import make_engine, make_sessionmaker, upgrade
    from scheduler_svc.store.tokens import TokenRepo
    from scheduler_svc.store.uow import unit_of_work

    if role == Role.AGENT and not node:
        typer.echo(
            "--node is required for an agent token (it may only speak for that node)", err=True
        )
        raise typer.Exit(2)
    if role != Role.AGENT and node:
        typer.echo("--node applies to agent tokens only", err=True)
        raise typer.Exit(2)
    lifetime = None
    if expires_in is not None:
        lifetime = _duration(expires_in)
        if lifetime is None:
            typer.echo(f"--expires-in {expires_in!r}: give seconds, or 90m, 12h, 30d", err=True)
            raise typer.Exit(2)
    settings = _settings(db)
    upgrade(settings.sqlalchemy_url)
    engine = make_engine(settings.sqlalchemy_url)
    now = datetime.now(UTC)
    with unit_of_work(make_sessionmaker(engine)) as session:
        row, plain = TokenRepo(session).create(
            role=role.value,
            node=node,
            description=description,
            now=now,
            expires_at=None if lifetime is None else now + lifetime,
        )
    engine.dispose()
    typer.echo(
        f"created token {row.token_id} ({role.value}{' for ' + node if node else ''})", err=True
    )
    typer.echo(plain)


@token_app.command("bootstrap")
def token_bootstrap(db: DbOpt = None) -> None:
    """On a store with no active token: create a fleet and a viewer token, print both.

    For installs (deploy/README.md): safe to run from several places at once or again,
    since only the first run on an empty store creates anything (under a store lock).
    Prints `fleet <token>` and `viewer <token>`, or nothing when tokens exist.
    """
    from scheduler_svc.store.db import (
        make_engine,
        make_sessionmaker,
        take_bootstrap_lock,
        upgrade,
    )
    from scheduler_svc.store.tokens import TokenRepo

    settings = _settings(db)
    upgrade(settings.sqlalchemy_url)
    engine = make_engine(settings.sqlalchemy_url)
    created: list[tuple[str, str]] = []
    with make_sessionmaker(engine)() as session, session.begin():
        take_bootstrap_lock(session)
        repo = TokenRepo(session)
        now = datetime.now(UTC)
        if repo.count_active(now) == 0:
            for role, what in (("fleet", "bootstrap"), ("viewer", "status page")):
                _, plain = repo.create(role=role, node=None, description=what, now=now)
                created.append((role, plain))
    engine.dispose()
    if not created:
        typer.echo("tokens exist already; none created", err=True)
        return
    for role, plain in created:
        typer.echo(f"{role} {plain}")


@token_app.command("list")
def token_list(db: DbOpt = None) -> None:
    """List tokens (ids and roles, never secrets)."""
    from scheduler_svc.store.db import make_engine, make_sessionmaker, upgrade
    from scheduler_svc.store.tokens import TokenRepo

    settings = _settings(db)
    upgrade(settings.sqlalchemy_url)
    engine = make_engine(settings.sqlalchemy_url)
    with make_sessionmaker(engine)() as session:
        for t in TokenRepo(session).all():
            state = "revoked" if t.revoked_at else "active"
            typer.echo(f"{t.token_id}\t{t.role}\t{t.node or '-'}\t{state}\t{t.description}")
    engine.dispose()


@token_app.command("revoke")
def token_revoke(token_id: str, db: DbOpt = None) -> None:
    """Revoke a token by id; it stops working at once."""
    from scheduler_svc.store.db import make_engine, make_sessionmaker
    from scheduler_svc.store.tokens import TokenRepo
    from scheduler_svc.store.uow import unit_of_work

    engine = make_engine(_settings(db).sqlalchemy_url)
    with unit_of_work(make_sessionmaker(engine)) as session:
        done = TokenRepo(session).revoke(token_id, datetime.now(UTC))
    engine.dispose()
    if not done:
        typer.echo(f"no active token {token_id!r}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {token_id}")


@db_app.command("upgrade")
def db_upgrade(db: DbOpt = None) -> None:
    """Apply schema migrations."""
    from scheduler_svc.store.db import upgrade

    upgrade(_settings(db).sqlalchemy_url)
    typer.echo("store is at the newest schema")


def _instant(flag: str, text: str | None, now: datetime) -> datetime | None:
    """An ISO time (UTC unless it names a zone), or a duration before now: 30d, 12h."""
    if text is None:
        return None
    ago = _duration(text)
    if ago is not None:
        return now - ago
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        refuse(
            f"{flag} {text!r}: neither a time nor a duration",
            "give an ISO time (2026-01-31 or 2026-01-31T12:00:00+00:00) or a duration "
            "before now (3600, 90m, 12h, 30d)",
        )
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


@app.command("export")
def export_command(
    db: DbOpt = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="From this time (ISO) or this long ago (30d); default: the first registration"
        ),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Up to this time (ISO) or this long ago; default: now")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Write the JSON here; default: standard output"),
    ] = None,
) -> None:
    """Write what the service recorded, as JSON, for `railover simulate/twin --history`.

    Inventory (nodes, GPUs, RNIC ports, switches, first registration), faults with their
    open, clear and close times and durations, inferred switch failures, jobs (ranks,
    nodes, checkpoint interval, reload, detection, declared and measured k), decisions
    with their commands' outcomes. No secrets: no tokens, webhook secrets or
    notification URLs. Read only; the schema is scheduler_svc/planning/history.py
    (`version` 1).
    """
    from scheduler_svc.planning.export import NotAStore, export_history

    settings = _settings(db)
    store_file = sqlite_path(settings.db_url) if settings.db_url.startswith("sqlite") else None
    if store_file is not None and not store_file.is_file():
        refuse(
            f"there is no store at {store_file}",
            "give the store `railover serve` uses: --db or RAILOVER_DB_URL",
        )
    now = datetime.now(UTC)
    start = _instant("--since", since, now)
    end = _instant("--until", until, now) or now
    if start is not None and start >= end:
        refuse(
            f"--since {start.isoformat()} is not before --until {end.isoformat()}",
            "give a window that ends after it starts",
        )
    if out is not None and not out.parent.is_dir():
        refuse(f"--out {out}: the folder {out.parent} does not exist", "create it first")
    try:
        history = export_history(settings, _store_shown, start, end, now)
    except NotAStore as exc:
        refuse(exc.problem, exc.fix)
    text = history.model_dump_json(indent=1) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text, encoding="utf-8")
        typer.echo(
            f"wrote {out}: {len(history.nodes)} nodes, {len(history.faults)} faults, "
            f"{len(history.jobs)} jobs, {len(history.decisions)} decisions, "
            f"{history.window.since.isoformat()} to {history.window.until.isoformat()}",
            err=True,
        )


@app.command("config")
def config_command(
    markdown: Annotated[bool, typer.Option(help="Print the README's Markdown tables.")] = False,
) -> None:
    """List every setting of the service and the agent: variable, type, default, meaning."""
    from scheduler_svc import config

    if markdown:
        typer.echo(config.markdown(), nl=False)
        return
    for program, cls in config.settings_classes():
        typer.echo(f"{program} (variable  type  [default]):\n")
        for doc in config.describe(cls):
            typer.echo(f"{doc.variable}  {doc.type}  [{doc.default}]\n    {doc.meaning}")
        typer.echo("")


def main() -> None:
    """The console script: two lines for each expected failure, a traceback for bugs."""
    from sqlalchemy.exc import OperationalError

    try:
        app()
    except OperationalError as exc:  # raised from deep in any command that opens the store
        if errors.debug:
            raise
        first = str(exc.orig or exc).strip().splitlines()[0]
        errors.explain(
            f"the store {_store_shown} cannot be reached or opened: {first}",
            "check that the database runs and that --db or RAILOVER_DB_URL names it "
            "(user, host, database)",
        )
        sys.exit(2)
