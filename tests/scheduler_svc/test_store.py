"""Migrations create exactly the models' schema, on both backends; a start migrates only a
store behind the code."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from scheduler_svc.store.db import alembic_config, at_head, make_engine, newest_revision, upgrade
from scheduler_svc.store.models import Base


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
