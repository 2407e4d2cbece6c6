"""A job's incarnations over the real API (issue 28): explicit, counted, and never mixed.

A restart decision ends an incarnation; the fleet manager's re-post (or a checkpoint
naming the next incarnation) starts the next. Reports of an ended incarnation are kept
as history and change nothing; what was on its way to it never reaches the new one.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from railover_testing.local import ManualClock
from tests.scheduler_svc.helpers import job_body, register_nodes, service_factory
from tests.scheduler_svc.sequences import ev, post
from tests.scheduler_svc.test_fault_lifecycle_api import T0, commands, decisions


@pytest.fixture
def http(db_url: str) -> Iterator[httpx.Client]:
    with service_factory(db_url, coordinator=False, command_ack_timeout_s=10**6) as start:
        yield start(clock=ManualClock(T0 + timedelta(seconds=3000))).http


def body(**kw: Any) -> dict[str, Any]:
    """A job on n0 and n1 whose last checkpoint was 3,000 s ago, with one communicator."""
    defaults: dict[str, Any] = {
        "last_checkpoint_at": T0.isoformat(),
        "communicators": [{"comm_id": 77, "channels": 16}],
    }
    return job_body("j", ["n0", "n1"], **(defaults | kw))


def checkpoint(http: httpx.Client, at_s: float, **kw: Any) -> httpx.Response:
    return http.post(
        "/v1/jobs/j/checkpoints", json={"at": (T0 + timedelta(seconds=at_s)).isoformat(), **kw}
    )


def restarted(http: httpx.Client) -> None:
    """Failed over at 3,000 s (the service's clock), then restarted at a checkpoint taken
    a second later (a day's repair ahead)."""
    register_nodes(http, ["n0", "n1"])
    r = http.post("/v1/jobs", json=body())
    assert (r.status_code, r.json()["incarnation"]) == (201, 1)
    post(http, ev("n0", "port_down", T0 + timedelta(seconds=2990)))
    assert checkpoint(http, 3001).status_code == 201
    assert [d["action"] for d in decisions(http, "j")] == ["restart", "failover"]
    assert http.get("/v1/jobs/j").json()["mode"] == "restarting"


def test_a_late_checkpoint_of_the_aborted_incarnation_changes_nothing(http: httpx.Client) -> None:
    """Case 7: taken before the restart decision, it is history; the re-post is taken."""
    restarted(http)
    r = checkpoint(http, 2999)
    assert (r.status_code, r.json()["current"]) == (201, False)
    assert checkpoint(http, 2997, incarnation=1).json()["current"] is False
    job = http.get("/v1/jobs/j").json()
    assert (job["mode"], job["incarnation"]) == ("restarting", 1)
    assert job["last_checkpoint_at"] == (T0 + timedelta(seconds=3001)).isoformat().replace(
        "+00:00", "Z"
    )
    r = http.post(
        "/v1/jobs", json=body(last_checkpoint_at=(T0 + timedelta(seconds=3001)).isoformat())
    )
    assert (r.status_code, r.json()["incarnation"]) == (201, 2), r.text


def test_aborts_still_on_their_way_never_reach_the_next_incarnation(http: httpx.Client) -> None:
    """Case 7, the reverse: the re-post withdraws what the ended incarnation was sent."""
    restarted(http)
    aborts = commands(http, "j", "abort")
    assert {c["incarnation"] for c in aborts} == {1} and len(aborts) == 2
    assert http.post("/v1/jobs", json=body()).status_code == 201
    assert {c["state"] for c in commands(http, "j", "abort")} == {"superseded"}
    for node in ("n0", "n1"):
        polled = http.get(f"/v1/nodes/{node}/commands").json()["commands"]
        assert all(c["incarnation"] == 2 for c in polled), polled
        assert "abort" not in {c["kind"] for c in polled}


def test_the_next_incarnation_on_the_same_nodes_runs_failed_over_once(http: httpx.Client) -> None:
    """Case 6: placed back on the broken NIC, it starts on its backups with one decision,
    and its checkpoints (one every iteration) never restart it again for that fault."""
    restarted(http)
    assert http.post("/v1/jobs", json=body()).status_code == 201
    job = http.get("/v1/jobs/j").json()
    assert (job["mode"], job["incarnation"]) == ("failed_over", 2)
    for i in range(10):
        r = checkpoint(http, 3002 + i, kind="flowcheck", iteration=100 + i)
        assert r.status_code == 201 and r.json()["current"] is True
    assert [d["action"] for d in decisions(http, "j")] == ["failover", "restart", "failover"]
    assert "not restarted again" in decisions(http, "j")[0]["reason"]
    assert http.get("/v1/jobs/j").json()["mode"] == "failed_over"


def test_a_checkpoint_naming_the_next_incarnation_starts_it(http: httpx.Client) -> None:
    """A restart acknowledged by the job itself: the same placement, incarnation 2."""
    restarted(http)
    r = checkpoint(http, 3002, incarnation=2)
    assert r.status_code == 201 and r.json()["current"] is True
    job = http.get("/v1/jobs/j").json()
    assert (job["mode"], job["incarnation"]) == ("failed_over", 2)


def test_incarnations_that_cannot_be_are_refused(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1"])
    assert http.post("/v1/jobs", json=body()).status_code == 201
    r = checkpoint(http, 10, incarnation=2)
    assert r.status_code == 409 and "incarnation 2 has not started" in r.text
    post(http, ev("n0", "port_down", T0 + timedelta(seconds=2990)))
    assert checkpoint(http, 3001).status_code == 201  # restart: incarnation 1 ended
    r = http.post("/v1/jobs", json=body(incarnation=1))
    assert r.status_code == 409 and "post incarnation 2 or later" in r.text
    assert checkpoint(http, 3002, incarnation=3).status_code == 409
    r = http.post("/v1/jobs", json=body(incarnation=5))
    assert (r.status_code, r.json()["incarnation"]) == (201, 5)
    zero = job_body("k", ["n0"], last_checkpoint_at=T0.isoformat(), incarnation=0)
    assert http.post("/v1/jobs", json=zero).status_code == 422


def test_epochs_go_on_across_incarnations(http: httpx.Client) -> None:
    """Case 12: (communicator, epoch) names one plan over the job's whole life."""
    restarted(http)
    before = max(c["epoch"] for c in commands(http, "j") if c["comm_id"] == 77)
    assert http.post("/v1/jobs", json=body()).status_code == 201
    later = [c for c in commands(http, "j") if c["incarnation"] == 2 and c["comm_id"] == 77]
    assert later, "the new incarnation's commands"
    assert min(c["epoch"] for c in later) > before
    plans = {(c["comm_id"], c["epoch"]): (c["kind"], c["ops_done"]) for c in commands(http, "j")}
    for c in commands(http, "j"):
        assert plans[(c["comm_id"], c["epoch"])] == (c["kind"], c["ops_done"]), c


def test_a_job_the_fleet_manager_restarted_on_its_own_is_posted_as_its_next_incarnation(
    http: httpx.Client,
) -> None:
    """A node died (nothing the service saw): the fleet manager requeued the job onto n2 and
    posts it naming incarnation 2. Its placement is the new one, what was on its way to
    incarnation 1 never reaches it, and a post that names no newer incarnation (a retry of
    the first) is still refused. Found by the fleet twin's node losses."""
    register_nodes(http, ["n0", "n1", "n2"])
    assert http.post("/v1/jobs", json=body()).status_code == 201
    post(http, ev("n0", "port_down", T0 + timedelta(seconds=2990)))  # late: failover
    assert [d["action"] for d in decisions(http, "j")] == ["failover"]
    assert {c["incarnation"] for c in commands(http, "j")} == {1}

    again = http.post("/v1/jobs", json=body())
    assert again.status_code == 409 and "post incarnation 2 if the fleet manager" in again.text
    moved = job_body(
        "j",
        ["n2", "n1"],
        last_checkpoint_at=T0.isoformat(),
        communicators=[{"comm_id": 77, "channels": 16}],
        incarnation=2,
    )
    r = http.post("/v1/jobs", json=moved)
    assert (r.status_code, r.json()["incarnation"]) == (201, 2), r.text
    job = http.get("/v1/jobs/j").json()
    assert (job["mode"], job["incarnation"]) == ("normal", 2)
    assert {(r["node"], r["rank"] // 8) for r in job["ranks"]} == {("n2", 0), ("n1", 1)}
    assert {c["state"] for c in commands(http, "j") if c["incarnation"] == 1} <= {
        "superseded",
        "applied",
        "failed",
    }
    for node in ("n0", "n1", "n2"):
        polled = http.get(f"/v1/nodes/{node}/commands").json()["commands"]
        assert all(c["incarnation"] == 2 for c in polled), polled
