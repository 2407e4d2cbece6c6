"""Refused optional mitigations over the real HTTP API, on SQLite and PostgreSQL (issue 28,
case 9): the job falls back, it is never restarted for them, and no node becomes unreachable.

An NVL transit refused (a plugin of ABI 1) leaves its communicator on s-Bond, never asked
again; a fail-back refused leaves its ranks failed over until the damping period has
passed, then it is tried again. The service runs on a clock the test moves; the
coordinator's sweep reads the same clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, timedelta
from typing import Any

import httpx
import pytest

from railover_testing.local import ManualClock
from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker
from tests.scheduler_svc.helpers import job_body, register_nodes, service_factory
from tests.scheduler_svc.sequences import ev, post
from tests.scheduler_svc.test_fault_lifecycle_api import (
    T0,
    commands,
    decisions,
    start_job,
    wait_for,
)

DAMPING_S = 60


@pytest.fixture
def make(db_url: str) -> Iterator[Callable[[], tuple[httpx.Client, ManualClock]]]:
    defaults: dict[str, Any] = {
        "coordinator_interval_s": 0.05,
        "failback_damping_s": DAMPING_S,
        "fault_quiet_s": 300,
        "command_ack_timeout_s": 10**6,  # every ack here is the test's
    }
    with service_factory(db_url, **defaults) as start:

        def started() -> tuple[httpx.Client, ManualClock]:
            clock = ManualClock(T0)
            return start(clock=clock).http, clock

        yield started


def stored(db_url: str, job_id: str) -> m.Job:
    """The job's row as the store holds it (desired, commanded, when it is due)."""
    engine = make_engine(Settings(db_url=db_url).sqlalchemy_url)
    try:
        with make_sessionmaker(engine)() as session:
            job = session.get(m.Job, job_id)
            assert job is not None
            session.expunge(job)
            return job
    finally:
        engine.dispose()


def ack(http: httpx.Client, cmd: dict[str, Any], status: str, detail: str = "") -> str:
    body = {"node": cmd["node"], "status": status, "detail": detail}
    r = http.post(f"/v1/commands/{cmd['command_id']}/acks", json=body)
    assert r.status_code == 200, r.text
    state: str = r.json()["state"]
    return state


def open_faults(http: httpx.Client) -> list[str]:
    return [f["kind"] for f in http.get("/v1/faults?open=true").json()["faults"]]


def sweeps() -> float:
    value: float = metrics.SWEEPS.labels(outcome="ok")._value.get()
    return value


ABI_1 = "unsupported: 1 plugin client(s) for comm_id 78 predate ABI 2 (nvl_transit)"


def test_refused_nvl_transit_runs_s_bond_only_and_is_never_asked_again(
    make: Callable[[], tuple[httpx.Client, ManualClock]], db_url: str
) -> None:
    http, clock = make()
    # 4 rails; GPU 2 of each node, one rail: mlx5_1 fails on r0, rank 0's backup mlx5_0
    # is behind another root complex, so rank 0 is sent through GPU 0 over NVLink. (Nodes
    # of their own: the plan cache knows n0 and n1, registered at T0, as 8-rail nodes.)
    register_nodes(http, ["r0", "r1"], rails=4)
    body = job_body(
        "nvl",
        ["r0", "r1"],
        ranks=[{"rank": 0, "node": "r0", "gpu": 2}, {"rank": 1, "node": "r1", "gpu": 2}],
        last_checkpoint_at=(T0 - timedelta(seconds=3000)).isoformat(),
        communicators=[{"comm_id": 78, "channels": 4}],
    )
    assert http.post("/v1/jobs", json=body).status_code == 201
    post(http, ev("r0", "port_down", T0, device="mlx5_1"))
    (first,) = decisions(http, "nvl")
    assert first["plan"]["communicators"][0]["mitigation"] == "nvl"
    (transit,) = commands(http, "nvl", "nvl_transit")
    assert (transit["node"], transit["ranks"], transit["transit"]) == ("r0", [0], [[0, 0]])
    # r0's CCL loaded a plugin of ABI 1: the agent answers that it cannot take it.
    clock.advance(1)
    assert ack(http, transit, "failed", ABI_1) == "failed"
    why = f"nvl_transit command {transit['command_id']} failed on r0 ({ABI_1})"
    latest = decisions(http, "nvl")[0]
    assert (latest["action"], latest["trigger"]) == ("failover", "refused:nvl_transit:78")
    assert latest["reason"] == (
        f"NVL transit refused by communicator 78's ranks ({why}): they run s-Bond only and "
        "are not asked again"
    )
    (comm,) = latest["plan"]["communicators"]
    assert (comm["mitigation"], comm["transit"]) == ("s-bond", [])
    # No restart, no node unreachable: rank 0 keeps running on its backup.
    assert http.get("/v1/jobs/nvl").json()["mode"] == "failed_over"
    assert open_faults(http) == ["link_down"]
    paths = http.get("/v1/jobs/nvl/paths").json()
    assert paths["failed_over_ranks"] == [0] and paths["ranks"][0]["active"] == "mlx5_0/1"
    job = stored(db_url, "nvl")
    assert "78" not in (job.commanded or {}).get("transit", {})
    assert (job.desired or {})["no_transit"] == {"78": why}
    # Passes after it plan the communicator again, and never ask for a transit: here
    # rank 1's primary fails too, and it fails over on s-Bond.
    clock.advance(1)
    post(http, ev("r1", "port_down", clock(), device="mlx5_1"))
    history = decisions(http, "nvl")
    assert [d["action"] for d in history] == ["failover", "failover", "failover"]
    assert history[0]["plan"]["communicators"][0]["mitigation"] == "s-bond"
    assert [(c["node"], c["ranks"]) for c in commands(http, "nvl", "failover")] == [
        ("r0", [0]),
        ("r1", [1]),
    ]
    assert [c["state"] for c in commands(http, "nvl", "nvl_transit")] == ["failed"]
    assert commands(http, "nvl", "abort") == []
    assert http.get("/v1/jobs/nvl/paths").json()["failed_over_ranks"] == [0, 1]


def test_refused_failback_stays_failed_over_and_is_tried_again_after_damping(
    make: Callable[[], tuple[httpx.Client, ManualClock]], db_url: str
) -> None:
    http, clock = make()
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"])
    post(http, ev("n0", "port_down", T0))
    assert decisions(http, "j")[0]["action"] == "failover"
    # The ranks take it: rank 3 is on its backup (a FAILOVER the fail-back withdrew on its
    # way would have moved nobody, and a refused fail-back would hold nobody there).
    for c in commands(http, "j"):
        assert ack(http, c, "applied") == "applied"
    clock.advance(10)
    post(http, ev("n0", "port_up", T0 + timedelta(seconds=10)))
    refused_at = clock.advance(DAMPING_S + 1)
    wait_for(lambda: decisions(http, "j")[0]["action"] == "failback")
    back = commands(http, "j", "failback")
    assert sorted(c["node"] for c in back) == ["n0", "n1"]
    sent = len(commands(http, "j"))
    # A rank on n0 cannot agree on the switch point: the fail-back is refused.
    (on_n0,) = [c for c in back if c["node"] == "n0"]
    assert ack(http, on_n0, "failed", "switch point not agreed") == "failed"
    # No rank applies it: n1's share is withdrawn; nothing else is sent, nothing restarts.
    assert {c["node"]: c["state"] for c in commands(http, "j", "failback")} == {
        "n0": "failed",
        "n1": "superseded",
    }
    assert len(commands(http, "j")) == sent
    assert commands(http, "j", "abort") == []
    assert open_faults(http) == []  # the link healed; no node is unreachable
    retry_at = refused_at + timedelta(seconds=DAMPING_S)
    why = f"failback command {on_n0['command_id']} failed on n0 (switch point not agreed)"
    latest = decisions(http, "j")[0]
    assert (latest["action"], latest["trigger"]) == ("failover", "refused:failback:77")
    assert latest["reason"] == (
        f"fail-back refused ({why}): 1 rank(s) of communicator 77 stay on their backup; it "
        f"is tried again at {retry_at.isoformat()}"
    )
    # The ranks stay failed over, in the views and in what the service says it told them.
    assert http.get("/v1/jobs/j").json()["mode"] == "failed_over"
    paths = http.get("/v1/jobs/j/paths").json()
    assert paths["failed_over_ranks"] == [3] and paths["ranks"][3]["active"] == "mlx5_2/1"
    job = stored(db_url, "j")
    assert job.commanded is not None and job.desired is not None
    assert (job.commanded["mode"], job.commanded["moved"]) == ("failed_over", {"3": "mlx5_2/1"})
    assert job.desired["moved"] == job.commanded["moved"]
    assert job.commanded["disabled"] == job.desired["disabled"] == {"77": [3, 11]}
    assert job.reconcile_due_at is not None
    assert job.reconcile_due_at.replace(tzinfo=UTC) == retry_at
    # Not before the damping period is over: sweeps come and go, nothing is sent.
    clock.advance(DAMPING_S - 1)
    swept = sweeps()
    wait_for(lambda: sweeps() >= swept + 3)
    assert decisions(http, "j")[0]["trigger"] == "refused:failback:77"
    assert len(commands(http, "j")) == sent
    # Then the fail-back is tried again: one new switch point for the whole communicator.
    clock.advance(1)
    wait_for(lambda: decisions(http, "j")[0]["action"] == "failback")
    again = [c for c in commands(http, "j", "failback") if c["state"] == "issued"]
    assert sorted(c["node"] for c in again) == ["n0", "n1"]
    assert len({(c["ops_done"], c["epoch"]) for c in again}) == 1
    assert again[0]["epoch"] > on_n0["epoch"]
    for c in again:
        assert ack(http, c, "applied") == "applied"
    assert http.get("/v1/jobs/j").json()["mode"] == "normal"
    assert http.get("/v1/jobs/j/paths").json()["failed_over_ranks"] == []
    assert [d["action"] for d in decisions(http, "j")] == [
        "failback",
        "failover",
        "failback",
        "failover",
    ]
    assert stored(db_url, "j").reconcile_due_at is None


def test_failover_refused_keeps_its_meaning(
    make: Callable[[], tuple[httpx.Client, ManualClock]],
) -> None:
    """Ranks that cannot move still make their node unreachable and restart the job."""
    http, _ = make()
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"])
    post(http, ev("n0", "port_down", T0))
    (cmd,) = commands(http, "j", "failover")
    assert ack(http, cmd, "failed", "no backup QP") == "failed"
    assert decisions(http, "j")[0]["action"] == "restart"
    assert sorted(open_faults(http)) == ["link_down", "unreachable"]
