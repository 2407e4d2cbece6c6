"""FlowCheck rebuild failures over real HTTP, on SQLite and PostgreSQL.

A checkpoint node reports an iteration it could not rebuild; the job is then asked
for a normal checkpoint (checkpoint_now to every node it runs on) until one newer than
that iteration is reported.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.scheduler_svc.helpers import CHECKPOINT, event, job_body, register_nodes

JOB = "llama"


def at(s: float) -> str:
    return (CHECKPOINT + timedelta(seconds=s)).isoformat()


def commands(http: httpx.Client) -> list[dict[str, Any]]:
    r = http.get(f"/v1/jobs/{JOB}/commands")
    assert r.status_code == 200, r.text
    return [c for c in r.json()["commands"] if c["kind"] == "checkpoint_now"]


@pytest.fixture
def job(http: httpx.Client) -> httpx.Client:
    register_nodes(http, ["n0", "n1"])
    r = http.post("/v1/jobs", json=job_body(JOB, ["n0", "n1"]))
    assert r.status_code == 201, r.text
    return http


def test_a_mirror_failure_asks_each_node_for_a_checkpoint_once(job: httpx.Client) -> None:
    http = job
    r = http.post(f"/v1/jobs/{JOB}/mirror-failures", json={"iteration": 500, "at": at(100)})
    assert r.status_code == 201, r.text
    first = r.json()
    assert {k: first[k] for k in ("job_id", "iteration", "created")} == {
        "job_id": JOB,
        "iteration": 500,
        "created": True,
    }
    assert first["checkpoint_requested_after"] == 500
    cmds = commands(http)
    assert [(c["node"], c["ranks"], c["iteration"], c["comm_id"], c["ops_done"]) for c in cmds] == [
        ("n0", list(range(8)), 500, 0, 0),
        ("n1", list(range(8, 16)), 500, 0, 0),
    ]
    assert {c["state"] for c in cmds} == {"issued"}
    assert http.get(f"/v1/jobs/{JOB}").json()["checkpoint_requested_after"] == 500
    # Nothing to decide: the paths did not change.
    assert http.get(f"/v1/jobs/{JOB}/decisions").json()["decisions"] == []

    # A replay (the checkpoint node's retry after a lost answer) applies nothing again,
    # and neither does another node's report of the same iteration at another time.
    for body in ({"iteration": 500, "at": at(100)}, {"iteration": 500, "at": at(101)}):
        again = http.post(f"/v1/jobs/{JOB}/mirror-failures", json=body)
        assert again.status_code == 200, again.text
        assert again.json() == first | {"created": False}
    assert [c["command_id"] for c in commands(http)] == [c["command_id"] for c in cmds]


def test_a_newer_normal_checkpoint_ends_the_request(job: httpx.Client) -> None:
    http = job
    r = http.post(f"/v1/jobs/{JOB}/mirror-failures", json={"iteration": 500, "at": at(100)})
    assert r.status_code == 201, r.text
    # FlowCheck's own checkpoints of later iterations rest on the lost one: still wanted.
    r = http.post(
        f"/v1/jobs/{JOB}/checkpoints",
        json={"at": at(106), "iteration": 501, "kind": "flowcheck"},
    )
    assert r.status_code == 201 and r.json()["checkpoint_requested_after"] == 500
    # A normal checkpoint of the failed iteration itself is not newer than it.
    r = http.post(f"/v1/jobs/{JOB}/checkpoints", json={"at": at(110), "iteration": 500})
    assert r.json()["checkpoint_requested_after"] == 500
    assert {c["state"] for c in commands(http)} == {"issued"}
    r = http.post(f"/v1/jobs/{JOB}/checkpoints", json={"at": at(112), "iteration": 502})
    assert r.status_code == 201 and r.json()["checkpoint_requested_after"] is None
    # The request is withdrawn where it was not taken yet, and nothing else goes out.
    assert [c["state"] for c in commands(http)] == ["superseded", "superseded"]
    assert http.get(f"/v1/jobs/{JOB}").json()["checkpoint_requested_after"] is None
    # A late report of an iteration the checkpoint already covers asks for nothing.
    late = http.post(f"/v1/jobs/{JOB}/mirror-failures", json={"iteration": 499, "at": at(98)})
    assert late.status_code == 201, late.text
    assert late.json()["checkpoint_requested_after"] is None
    assert len(commands(http)) == 2
    # A new loss after it asks again, for the new iteration.
    r = http.post(f"/v1/jobs/{JOB}/mirror-failures", json={"iteration": 900, "at": at(500)})
    assert r.json()["checkpoint_requested_after"] == 900
    assert [(c["iteration"], c["state"]) for c in commands(http)][2:] == [
        (900, "issued"),
        (900, "issued"),
    ]


def test_a_second_loss_replaces_the_request_still_on_its_way(job: httpx.Client) -> None:
    http = job
    http.post(f"/v1/jobs/{JOB}/mirror-failures", json={"iteration": 500, "at": at(100)})
    r = http.post(f"/v1/jobs/{JOB}/mirror-failures", json={"iteration": 503, "at": at(120)})
    assert r.status_code == 201 and r.json()["checkpoint_requested_after"] == 503
    assert [(c["iteration"], c["state"]) for c in commands(http)] == [
        (500, "superseded"),
        (500, "superseded"),
        (503, "issued"),
        (503, "issued"),
    ]


def test_mirror_failure_of_an_unknown_job_is_404(http: httpx.Client) -> None:
    r = http.post("/v1/jobs/nope/mirror-failures", json={"iteration": 1, "at": at(0)})
    assert r.status_code == 404
    assert r.json()["error"] == "not_found"


FUTURE = (datetime.now(UTC) + timedelta(days=2)).isoformat()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"at": at(0)}, "iteration"),
        ({"iteration": -1, "at": at(0)}, "iteration"),
        ({"iteration": 2**60, "at": at(0)}, "iteration"),
        ({"iteration": "5", "at": at(0)}, "iteration"),
        ({"iteration": 1.5, "at": at(0)}, "iteration"),
        ({"iteration": True, "at": at(0)}, "iteration"),
        ({"iteration": 5}, "at"),
        ({"iteration": 5, "at": "2026-11-01T12:00:00"}, "at"),  # no zone
        ({"iteration": 5, "at": "yesterday"}, "at"),
        ({"iteration": 5, "at": FUTURE}, "at"),
        ({"iteration": 5, "at": at(0), "node": "cpu7"}, "node"),
    ],
)
def test_bad_mirror_failure_is_422_naming_the_field(
    job: httpx.Client, body: dict[str, Any], field: str
) -> None:
    r = job.post(f"/v1/jobs/{JOB}/mirror-failures", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid"
    assert field in [f["field"] for f in r.json()["fields"]], r.json()
    # Nothing was stored or asked for.
    assert commands(job) == []
    assert job.get(f"/v1/jobs/{JOB}").json()["checkpoint_requested_after"] is None


def test_a_restarted_job_is_not_asked_for_its_old_incarnations_checkpoint(
    job: httpx.Client,
) -> None:
    http = job
    http.post(f"/v1/jobs/{JOB}/mirror-failures", json={"iteration": 500, "at": at(50)})
    # 100 s into an hour's interval: restarting is cheaper. The abort replaces the request.
    r = http.post("/v1/events", json={"events": [event("n0", after_s=100)]})
    assert r.status_code == 202, r.text
    (decision,) = http.get(f"/v1/jobs/{JOB}/decisions").json()["decisions"]
    assert decision["action"] == "restart"
    assert decision["inputs"]["t_elapsed_s"] == 100.0
    assert [c["state"] for c in commands(http)] == ["superseded", "superseded"]
    # The fleet manager posts the new incarnation, resumed from its newest checkpoint.
    r = http.post("/v1/jobs", json=job_body(JOB, ["n0", "n1"]))
    assert r.status_code == 201, r.text
    assert r.json()["checkpoint_requested_after"] is None
    assert len(commands(http)) == 2
