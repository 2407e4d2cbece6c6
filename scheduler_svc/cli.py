"""`railover`: run the service, manage tokens, play the demo, plan with the tools."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from scheduler_svc.config import Settings, is_loopback
from scheduler_svc.planning import cli as planning_cli
from scheduler_svc.schemas import Role

app = typer.Typer(
    name="railover",
    help="Railover: cluster-wide RDMA NIC failover decisions for GPU training jobs.",
    no_args_is_help=True,
    add_completion=False,
)
token_app = typer.Typer(help="Create, list and revoke API tokens.", no_args_is_help=True)
db_app = typer.Typer(help="Store maintenance.", no_args_is_help=True)
app.add_typer(token_app, name="token")
app.add_typer(db_app, name="db")
planning_cli.register(app)

DbOpt = Annotated[
    str | None,
    typer.Option("--db", help="SQLAlchemy URL (default: RAILOVER_DB_URL or sqlite:///railover.db)"),
]


def _settings(db: str | None = None, **overrides: object) -> Settings:
    values = {k: v for k, v in overrides.items() if v is not None}
    if db is not None:
        values["db_url"] = db
    return Settings(**values)  # type: ignore[arg-type]  # validated by pydantic at run time


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Address to listen on [127.0.0.1]")] = None,
    port: Annotated[int | None, typer.Option(help="Port [8080]")] = None,
    db: DbOpt = None,
) -> None:
    """Run the service (migrates the store first)."""
    import uvicorn

    from scheduler_svc.main import create_app
    from scheduler_svc.store.db import make_engine, make_sessionmaker, upgrade
    from scheduler_svc.store.repositories import TokenRepo

    settings = _settings(db, host=host, port=port)
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
    uvicorn.run(
        create_app(settings, migrate=False),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
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
    from scheduler_svc.store.repositories import TokenRepo

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
    with make_sessionmaker(engine)() as session:
        row, plain = TokenRepo(session).create(
            role=role.value,
            node=node,
            description=description,
            now=now,
            expires_at=None if lifetime is None else now + lifetime,
        )
        session.commit()
    engine.dispose()
    typer.echo(
        f"created token {row.token_id} ({role.value}{' for ' + node if node else ''})", err=True
    )
    typer.echo(plain)


@token_app.command("list")
def token_list(db: DbOpt = None) -> None:
    """List tokens (ids and roles, never secrets)."""
    from scheduler_svc.store.db import make_engine, make_sessionmaker, upgrade
    from scheduler_svc.store.repositories import TokenRepo

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
    from scheduler_svc.store.repositories import TokenRepo

    engine = make_engine(_settings(db).sqlalchemy_url)
    with make_sessionmaker(engine)() as session:
        done = TokenRepo(session).revoke(token_id, datetime.now(UTC))
        session.commit()
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


@app.command()
def demo(
    keep_running: Annotated[bool, typer.Option(help="Leave the service up afterwards")] = False,
) -> None:
    """Start the service on SQLite, inject faults into a small cluster and show the decisions."""
    run_demo = _load_demo()
    raise typer.Exit(run_demo(keep_running=keep_running))


def _load_demo() -> Callable[..., int]:
    """The demo lives in `railover_testing/` beside the packages of a source checkout."""
    try:
        from railover_testing.demo import run_demo
    except ModuleNotFoundError:
        checkout = Path(__file__).resolve().parents[1]
        if not (checkout / "railover_testing" / "demo.py").is_file():
            typer.echo(
                "railover demo runs from a source checkout: clone the repository and run "
                "`make demo`",
                err=True,
            )
            raise typer.Exit(2) from None
        sys.path.insert(0, str(checkout))
        from railover_testing.demo import run_demo
    return run_demo


def main() -> None:
    app()
