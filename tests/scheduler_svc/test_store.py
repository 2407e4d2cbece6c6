"""Migrations create exactly the models' schema, on both backends; a start migrates only a
store behind the code; the fleet's registration stamp moves with its topology."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import delete, func, select

from railover_testing.cluster_shapes import hgx_node
from scheduler_svc.api.schemas.nodes import NodeIn
from scheduler_svc.config import Settings
from scheduler_svc.services import registry
from scheduler_svc.store.db import (
    alembic_config,
    at_head,
    make_engine,
    make_sessionmaker,
    newest_revision,
    upgrade,
)
from scheduler_svc.store.models import Base, FleetStamp
from scheduler_svc.store.nodes import NodeRepo


def test_migrations_match_models(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == [], f"models and migrations differ; add a migration: {diff}"


def test_a_start_migrates_a_store_behind_the_code_and_skips_one_at_its_head(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'railover.db'}"
    head = newest_revision()
    before = ScriptDirectory.from_config(alembic_config(url)).get_revision(head).down_revision
    assert isinstance(before, str)
    assert not at_head(url)  # no schema at all
    command.upgrade(alembic_config(url), before)
    assert not at_head(url)  # one migration behind
    upgrade(url)
    assert at_head(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_heads() == (head,)
    engine.dispose()
    command.stamp(alembic_config(url), before)  # a store the code is newer than
    assert not at_head(url)


def test_the_fleet_stamp_changes_with_the_fleets_topology_only(db_url: str) -> None:
    """Renewed by a new node and a changed topology, in the registration's own transaction;
    not by a node registering as it was. A value rolled back never comes back: plans that
    the rolled-back transaction cached under it must not pass for current after the next
    registration. A store whose row is missing gets one."""
    settings = Settings(db_url=db_url)
    upgrade(db_url)
    engine = make_engine(db_url)
    node = NodeIn.model_validate(hgx_node())
    moved = NodeIn.model_validate(hgx_node(switch_name="spare{rail}-leaf"))
    sessions = make_sessionmaker(engine)
    inside: list[int] = []  # the stamp as each registration's own transaction saw it

    def register(name: str, body: NodeIn, *, commit: bool = True) -> int:
        with sessions() as s:
            with s.begin() as tx:
                registry.register_node(s, name, body, datetime.now(UTC), settings)
                inside.append(NodeRepo(s).fleet_stamp())
                if not commit:
                    tx.rollback()
            return NodeRepo(s).fleet_stamp()

    try:
        first = register("a", node)
        assert register("a", node) == first  # the same topology again
        added = register("b", node)  # a new node
        assert added != first
        recabled = register("a", moved)
        assert recabled not in (first, added)
        assert register("c", node, commit=False) == recabled  # rolled back with it
        rolled_back = inside[-1]
        assert rolled_back != recabled
        assert register("d", node) not in (rolled_back, recabled, added, first)
        with sessions() as s, s.begin():
            s.execute(delete(FleetStamp))
        register("a", node)
        with sessions() as s:
            assert s.scalar(select(func.count()).select_from(FleetStamp)) == 1
    finally:
        engine.dispose()
