"""schemathesis against the real service, on SQLite and on PostgreSQL: it must find nothing.

Every check. On SQLite every phase (examples, coverage, fuzzing, stateful with
the document's links: job -> decisions, paths, commands; command -> ack),
bounded by examples per operation. On PostgreSQL the examples and coverage
phases with schema-valid data only: what a store answers differently is the edge
of a value (the largest integer, the longest name, the odd character) that reaches
it, which those two derive from the schema deterministically. Invalid data is
refused by validation before the route runs (the store sees the token lookup and
the audit entry, neither of which changes the answer), so on PostgreSQL it would
repeat what SQLite's run checked (3,694 of the 5,732 cases, half the time); the
random and stateful phases drive the service's logic, the same code on either
store. The exclusions, each with its reason, are in schemathesis.toml here; a job
registered first (fzjob) lets the job routes reach their real work.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from railover_testing.cluster_shapes import hgx_node
from railover_testing.local import local_service
from railover_testing.waiting import thread_stacks
from scheduler_svc.config import Settings
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.tokens import TokenRepo
from tests.scheduler_svc.helpers import event, job_body

HERE = Path(__file__).parent
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
MAX_EXAMPLES = int(os.environ.get("RAILOVER_FUZZ_EXAMPLES", "5"))
SEED = os.environ.get("RAILOVER_FUZZ_SEED", "20261201")
PHASES = {"sqlite": "examples,coverage,fuzzing,stateful", "postgres": "examples,coverage"}
MODES = {"sqlite": "all", "postgres": "positive"}


def _fleet_token(settings: Settings) -> str:
    engine = make_engine(settings.sqlalchemy_url)
    with make_sessionmaker(engine)() as session:
        _, plain = TokenRepo(session).create(
            role="fleet", node=None, description="schemathesis", now=datetime.now(UTC)
        )
        session.commit()
    engine.dispose()
    return plain


@pytest.mark.timeout(300)
def test_schemathesis_finds_nothing(db_url: str, tmp_path: Path) -> None:
    backend = "sqlite" if db_url.startswith("sqlite") else "postgres"
    # Long-polls and streams are cut short so one generated wait_s=120 cannot eat the budget.
    settings = Settings(
        db_url=db_url,
        port=0,
        allow_anonymous_loopback=True,
        commands_wait_max_s=0.2,
        commands_stream_max_s=0.2,
    )
    token = _fleet_token(settings)
    with local_service(settings) as url:
        _seed(url, token)
        run = subprocess.run(
            [
                str(SCHEMATHESIS),
                "--config-file",
                str(HERE / "schemathesis.toml"),
                "--no-color",
                "run",
                f"{url}/openapi.json",
                "--checks",
                "all",
                "--phases",
                PHASES[backend],
                "--mode",
                MODES[backend],
                "--max-examples",
                str(MAX_EXAMPLES),
                "--seed",
                SEED,
                "--workers",
                "1",
                "--request-timeout",
                "20",
                "--header",
                f"Authorization: Bearer {token}",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=280,
            check=False,
        )
    assert run.returncode == 0, _failures(run.stdout + run.stderr)


def _seed(url: str, token: str) -> None:
    """Two nodes, a job on them with a communicator, and a fault decided for it.

    Each call takes milliseconds; the minute allowed is for a loaded machine, and a call
    that outlasts it fails with where every thread of this process (the service's
    included) was then."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        try:
            for node in ("fz0", "fz1"):
                http.put(f"/v1/nodes/{node}", json=hgx_node()).raise_for_status()
            comms = [{"comm_id": 7, "channels": 8}]
            job = job_body("fzjob", ["fz0", "fz1"], communicators=comms)
            http.post("/v1/jobs", json=job).raise_for_status()
            r = http.post("/v1/events", json={"events": [event("fz0", after_s=3000)]})
        except httpx.TimeoutException as exc:
            pytest.fail(f"seeding the service timed out ({exc!r}); threads:\n{thread_stacks()}")
        assert r.status_code == 202 and r.json()["decisions"], r.text


def _failures(report: str) -> str:
    """The failures section, each line cut short (a generated body can be megabytes)."""
    start = report.find("FAILURES")
    end = report.find("SUMMARY", start)
    section = report[start:end] if start >= 0 else report[-8000:]
    return "\n".join(line[:400] for line in section.splitlines())[:20000]
