"""A flood of unauthenticated writes against a real service: the audit log keeps counts,
not rows (issue 30: each 401 wrote an audit row, 6,926 rows and 5.7 MB in 20 s)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import select

from railover_testing.local import local_service
from scheduler_svc.config import Settings
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker, upgrade
from scheduler_svc.store.tokens import TokenRepo

FLOOD = 500


def test_refused_writes_are_one_audit_entry_per_peer_status_and_minute(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'r.db'}"
    upgrade(db_url)
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s:
        _, fleet = TokenRepo(s).create(
            role="fleet", node=None, description="", now=datetime.now(UTC)
        )
        s.commit()
    try:
        with (
            local_service(Settings(db_url=db_url, port=0)) as url,
            httpx.Client(base_url=url, timeout=30) as http,
        ):
            statuses = {http.post("/v1/jobs", json={}).status_code for _ in range(FLOOD)}
            assert statuses == {401}
            # An authenticated write is still its own entry.
            r = http.delete("/v1/jobs/nope", headers={"Authorization": f"Bearer {fleet}"})
            assert r.status_code == 404
        # Stopped: the minute's counts are written.
        with sessions() as s:
            rows = s.scalars(select(m.AuditEntry).order_by(m.AuditEntry.id)).all()
            refused = [r for r in rows if r.token_id is None]
            own = [r for r in rows if r.token_id is not None]
            assert sum(r.count for r in refused) == FLOOD
            assert len(refused) <= 2  # the flood may straddle a minute
            assert {(r.status, r.client, r.method) for r in refused} == {(401, "127.0.0.1", "*")}
            assert [(r.method, r.status, r.count) for r in own] == [("DELETE", 404, 1)]
    finally:
        engine.dispose()
