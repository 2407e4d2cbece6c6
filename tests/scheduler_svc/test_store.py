"""Migrations create exactly the models' schema, on both backends."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from scheduler_svc.store.db import make_engine
from scheduler_svc.store.models import Base


def test_migrations_match_models(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == [], f"models and migrations differ; add a migration: {diff}"
