"""Planned maintenance over the real HTTP API, on SQLite and PostgreSQL.

The service runs on a clock the test moves: the lead time, the window and the damping
after it pass when the test says, and the coordinator's sweep (on the same clock)
notices each of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from railover_testing.local import ManualClock
from railover_testing.waiting import wait_until
from scheduler_svc.config import Settings
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.tokens import TokenRepo
from tests.scheduler_svc.helpers import register_nodes, service_factory
from tests.scheduler_svc.test_fault_lifecycle_api import (
    T0,
    as_,
    commands,
    decisions,
    start_job,
)

DAMPING_S = 60
LEAD_S = 120

Make = Callable[..., tuple[httpx.Client, ManualClock]]


@pytest.fixture
def make(db_url: str) -> Iterator[Make]:
    defaults: dict[str, Any] = {
        "coordinator_interval_s": 0.05,
        "failback_damping_s": DAMPING_S,
        "maintenance_lead_s": LEAD_S,
        "command_ack_timeout_s": 10**6,  # these tests move time; acks are not their subject
    }
    with service_factory(db_url, **defaults) as start:

        def started(**overrides: Any) -> tuple[httpx.Client, ManualClock]:
            clock = ManualClock(T0)
            return start(clock=clock, **overrides).http, clock

        yield started


@pytest.fixture
def tokens(db_url: str) -> dict[str, str]:
    engine = make_engine(Settings(db_url=db_url).sqlalchemy_url)
    out = {}
    with make_sessionmaker(engine)() as s:
        repo = TokenRepo(s)
        for role, node in (("fleet", None), ("viewer", None), ("agent", "n0")):
            out[node or role] = repo.create(role=role, node=node, description="", now=T0)[1]
        s.commit()
    engine.dispose()
    return out


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def plan(http: httpx.Client, target: dict[str, Any], start_s: float, **kw: Any) -> httpx.Response:
    body = {"target": target, "start_at": at(start_s), "duration_s": 3600, "reason": "upgrade"}
    return http.post("/v1/maintenance", json=body | kw)


def window(http: httpx.Client, window_id: int) -> dict[str, Any]:
    r = http.get("/v1/maintenance", params={"include_done": True})
    assert r.status_code == 200, r.text
    (row,) = [w for w in r.json()["maintenance"] if w["id"] == window_id]
    return dict(row)


def waits(check: Callable[[], bool]) -> None:
    assert wait_until(check, timeout=20), "condition not met in time"


def event_types(http: httpx.Client) -> list[str]:
    r = http.get("/v1/deliveries", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return [d["event_type"] for d in r.json()["deliveries"]]


def test_switch_maintenance_moves_every_rank_before_it_starts_and_fails_back_after(
    make: Make,
) -> None:
    http, clock = make()
    register_nodes(http, ["n0", "n1", "n2", "n3"])
    start_job(http, "j", ["n0", "n1"], comm_id=77)
    start_job(http, "other", ["n2", "n3"], comm_id=78)
    sub = http.post(
        "/v1/subscriptions",
        json={
            "url": "http://127.0.0.1:9/hook",
            "event_types": [
                "io.railover.maintenance.scheduled",
                "io.railover.maintenance.started",
                "io.railover.maintenance.ended",
            ],
        },
    )
    assert sub.status_code == 201, sub.text
    r = plan(http, {"switch": "rail3-leaf"}, 600)
    assert r.status_code == 201, r.text
    w = r.json()
    assert (w["phase"], w["would_restart"], w["decisions"]) == ("scheduled", [], [])
    assert w["moves_at"] == at(600 - LEAD_S).replace("+00:00", "Z")
    assert decisions(http, "j") == [] and commands(http, "j") == []

    # The lead time begins: both jobs move off rail 3 before anything goes down.
    clock.advance(600 - LEAD_S)
    waits(lambda: len(decisions(http, "j")) == 1 and len(decisions(http, "other")) == 1)
    for job, comm in (("j", 77), ("other", 78)):
        (d,) = decisions(http, job)
        assert (d["action"], d["trigger"]) == ("failover", f"maintenance:{w['id']}")
        assert f"planned maintenance {w['id']} (upgrade)" in d["reason"]
        assert d["inputs"]["planned"] is True
        assert {m["rank"] for m in d["plan"]["failed_over"]} == {3, 11}
        paths = http.get(f"/v1/jobs/{job}/paths").json()
        assert paths["failed_over_ranks"] == [3, 11]
        assert {paths["ranks"][r]["active"] for r in (3, 11)} == {"mlx5_2/1"}
        # One switch point for the communicator, told to all 16 ranks.
        switch_points = commands(http, job, "balance")
        assert {c["comm_id"] for c in switch_points} == {comm}
        assert len({(c["ops_done"], c["epoch"]) for c in switch_points}) == 1
        assert sorted(r for c in switch_points for r in c["ranks"]) == list(range(16))
        assert all(3 in c["disabled_channels"] for c in switch_points)
    assert window(http, w["id"])["phase"] == "moving"
    # Nothing failed: no fault, no switch failure, nothing for Kubernetes or Slurm to mark.
    assert http.get("/v1/faults").json()["faults"] == []
    assert http.get("/v1/fabric").json()["switch_faults"] == []

    clock.advance(LEAD_S)
    waits(lambda: window(http, w["id"])["phase"] == "active")
    assert len(decisions(http, "j")) == 1  # the window opening is no news to the job

    # The window ends; after the damping period the ranks return at one op count.
    clock.advance(3600)
    waits(lambda: window(http, w["id"])["phase"] == "ended")
    assert http.get("/v1/jobs/j").json()["mode"] == "failed_over"
    clock.advance(DAMPING_S)
    waits(lambda: decisions(http, "j")[0]["action"] == "failback")
    waits(lambda: decisions(http, "other")[0]["action"] == "failback")
    back = decisions(http, "j")[0]
    assert back["trigger"] == f"failback:maintenance:{w['id']}"
    assert http.get("/v1/jobs/j").json()["mode"] == "normal"
    assert http.get("/v1/jobs/j/paths").json()["failed_over_ranks"] == []
    failbacks = commands(http, "j", "failback")
    assert len({(c["ops_done"], c["epoch"]) for c in failbacks}) == 1
    assert sorted(r for c in failbacks for r in c["ranks"]) == list(range(16))
    assert window(http, w["id"])["phase"] == "done"
    assert http.get("/v1/maintenance").json()["maintenance"] == []
    assert event_types(http) == [
        "io.railover.maintenance.scheduled",
        "io.railover.maintenance.started",
        "io.railover.maintenance.ended",
    ]


def test_maintenance_that_leaves_a_rank_without_a_path_reports_the_job(make: Make) -> None:
    http, clock = make()
    register_nodes(http, ["n0", "n1", "n2", "n3"])
    start_job(http, "on-n1", ["n0", "n1"], comm_id=77)
    start_job(http, "elsewhere", ["n2", "n3"], comm_id=78)
    # A whole node: its GPUs have no RNIC left, so only a restart gets the job past it.
    r = plan(http, {"node": "n1"}, 600)
    assert r.status_code == 201, r.text
    w = r.json()
    assert w["would_restart"] == ["on-n1"]
    assert window(http, w["id"])["would_restart"] == ["on-n1"]
    # One RNIC port: its rank has a backup, so nothing restarts.
    r = plan(http, {"node": "n2", "device": "mlx5_4", "port": 1}, 600)
    assert (r.status_code, r.json()["would_restart"]) == (201, [])
    clock.advance(600 - LEAD_S)
    waits(lambda: len(decisions(http, "on-n1")) == 1 and len(decisions(http, "elsewhere")) == 1)
    (restart,) = decisions(http, "on-n1")
    assert restart["action"] == "restart" and "no usable path" in restart["reason"]
    assert http.get("/v1/jobs/on-n1").json()["mode"] == "restarting"
    (moved,) = decisions(http, "elsewhere")
    assert moved["action"] == "failover" and moved["inputs"]["planned"] is True
    assert http.get("/v1/jobs/elsewhere/paths").json()["failed_over_ranks"] == [4]


def test_cancelled_maintenance_fails_back_before_its_end(make: Make) -> None:
    http, clock = make()
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"])
    # Starting now: the job moves in the same request.
    r = plan(http, {"node": "n0", "device": "mlx5_5"}, 0)
    assert r.status_code == 201, r.text
    w = r.json()
    assert w["phase"] == "active" and len(w["decisions"]) == 1
    assert http.get("/v1/jobs/j/paths").json()["failed_over_ranks"] == [5]
    clock.advance(600)
    r = http.delete(f"/v1/maintenance/{w['id']}")
    assert r.status_code == 200, r.text
    assert r.json()["phase"] == "ended" and r.json()["cancelled_at"] is not None
    assert http.delete(f"/v1/maintenance/{w['id']}").status_code == 409
    # The window had opened: the RNIC is damped like a port that came back.
    assert http.get("/v1/jobs/j").json()["mode"] == "failed_over"
    clock.advance(DAMPING_S)
    waits(lambda: decisions(http, "j")[0]["action"] == "failback")
    assert http.get("/v1/jobs/j/paths").json()["failed_over_ranks"] == []
    assert window(http, w["id"])["phase"] == "done"

    # Called off during its lead time, before the window opened: back at once.
    r = plan(http, {"node": "n1", "device": "mlx5_1", "port": 1}, 660 + LEAD_S / 2)
    assert r.json()["phase"] == "moving", r.text
    assert http.get("/v1/jobs/j/paths").json()["failed_over_ranks"] == [9]
    r = http.delete(f"/v1/maintenance/{r.json()['id']}")
    assert (r.status_code, r.json()["phase"]) == (200, "done")
    assert decisions(http, "j")[0]["action"] == "failback"
    assert http.get("/v1/jobs/j/paths").json()["failed_over_ranks"] == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"target": {"switch": "no-such-switch"}}, "target.switch"),
        ({"target": {"node": "n9"}}, "target.node"),
        ({"target": {"node": "n0", "device": "mlx5_9"}}, "target.device"),
        ({"target": {"node": "n0", "device": "mlx5_0", "port": 2}}, "target.port"),
        ({"target": {"node": "n0", "port": 1}}, "target"),
        ({"target": {"switch": "rail0-leaf", "node": "n0"}}, "target"),
        ({"target": {}}, "target"),
        ({"target": {"node": "bad name"}}, "target.node"),
        ({"duration_s": 0}, "duration_s"),
        ({"duration_s": 8 * 86400}, "duration_s"),
        ({"duration_s": "3600"}, "duration_s"),
        ({"start_at": "tomorrow"}, "start_at"),
        ({"start_at": "2026-11-01T12:00:00"}, "start_at"),  # no offset
        ({"start_at": at(-7200)}, "start_at"),  # over an hour before now
        ({"start_at": at(366 * 86400)}, "start_at"),
        ({"start_at": "9999-12-31T23:59:59Z"}, "start_at"),
        ({"start_at": "0001-01-01T00:00:00Z"}, "start_at"),
        ({"reason": ""}, "reason"),
        ({"window": 1}, "window"),
    ],
)
def test_bad_maintenance_requests_are_refused_naming_the_field(
    make: Make, change: dict[str, Any], field: str
) -> None:
    http, _ = make()
    register_nodes(http, ["n0"])
    body = {
        "target": {"switch": "rail0-leaf"},
        "start_at": at(600),
        "duration_s": 3600,
        "reason": "upgrade",
    } | change
    r = http.post("/v1/maintenance", json=body)
    assert r.status_code == 422, r.text
    assert field in {f["field"] for f in r.json()["fields"]}, r.text
    assert http.get("/v1/maintenance").json()["maintenance"] == []


def test_maintenance_routes_answer_404_and_need_the_fleet_role(
    make: Make, tokens: dict[str, str]
) -> None:
    http, _ = make()
    url = str(http.base_url)
    with as_(url, tokens["viewer"]) as viewer, as_(url, tokens["n0"]) as agent:
        for who in (viewer, agent):
            r = plan(who, {"switch": "rail0-leaf"}, 600)
            assert r.status_code == 403, r.text
            assert who.delete("/v1/maintenance/1").status_code == 403
        assert viewer.get("/v1/maintenance").status_code == 200
    http = as_(url, tokens["fleet"])
    assert http.delete("/v1/maintenance/12345").status_code == 404
    assert http.delete("/v1/maintenance/0").status_code == 422
    # Ids past the 32-bit column name nothing: refused with the bound, never a 500
    # (PostgreSQL cannot compare them with an INTEGER key; schemathesis found it).
    for path in (
        "/v1/maintenance/2147483648",
        "/v1/maintenance-flags/2147483648",
    ):
        r = http.delete(path)
        assert r.status_code == 422 and "2147483647" in r.text, (path, r.text)
    r = http.post("/v1/faults/2147483648/resolve", json={"reason": "swapped"})
    assert r.status_code == 422 and "2147483647" in r.text, r.text
    assert http.delete("/v1/maintenance/2147483647").status_code == 404
    assert http.get("/v1/maintenance", params={"limit": 0}).status_code == 422
