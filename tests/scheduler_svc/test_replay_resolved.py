"""A batch re-sent after its fault closed changes nothing: no new fault, no decision.

Agents resend a batch whose 202 they never saw (the spool keeps events until
then), so the same ``[port_down, port_up]`` can arrive again long after the
service closed the fault it described.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.scheduler_svc.helpers import event, job_body, register_nodes


def setup(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1"])
    assert http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"])).status_code == 201


def store_state(http: httpx.Client) -> dict[str, Any]:
    return {
        "fabric": http.get("/v1/fabric", params={"include_cleared": "true"}).json(),
        "decisions": http.get("/v1/jobs/j1/decisions").json(),
        "commands": http.get("/v1/jobs/j1/commands").json(),
        "job": http.get("/v1/jobs/j1").json(),
    }


def test_replayed_flap_batch_after_it_closed_changes_nothing(http: httpx.Client) -> None:
    setup(http)
    batch = [event("n0", "port_down", after_s=2000), event("n0", "port_up", after_s=2001)]
    first = http.post("/v1/events", json={"events": batch})
    assert first.status_code == 202
    body = first.json()
    assert (body["accepted"], body["duplicates"], body["faults_opened"]) == (2, 0, 1)
    # A flap reported with its recovery changes no path: nothing to decide.
    assert body["decisions"] == []
    before = store_state(http)
    (fault,) = before["fabric"]["faults"]
    assert fault["cleared_at"] is not None  # the port_up closed it
    assert before["decisions"]["decisions"] == []

    for replay in (batch, batch[::-1], batch[:1], batch[1:]):
        again = http.post("/v1/events", json={"events": replay})
        assert again.status_code == 202
        assert again.json() == {
            "accepted": 0,
            "duplicates": len(replay),
            "faults_opened": 0,
            "decisions": [],
        }
        assert store_state(http) == before


def test_replayed_fault_batch_after_recovery_does_not_reopen_it(http: httpx.Client) -> None:
    setup(http)
    down = event("n0", "port_down", after_s=2000)
    assert http.post("/v1/events", json={"events": [down]}).json()["faults_opened"] == 1
    up = event("n0", "port_up", after_s=2500)
    assert http.post("/v1/events", json={"events": [up]}).json()["faults_opened"] == 0
    before = store_state(http)
    assert [f["cleared_at"] is not None for f in before["fabric"]["faults"]] == [True]
    again = http.post("/v1/events", json={"events": [down, up]}).json()
    assert again == {"accepted": 0, "duplicates": 2, "faults_opened": 0, "decisions": []}
    assert store_state(http) == before
    # A new failure of the same port (a new event id) is a new fault.
    fresh = http.post("/v1/events", json={"events": [event("n0", after_s=2600)]}).json()
    assert (fresh["accepted"], fresh["faults_opened"], len(fresh["decisions"])) == (1, 1, 1)
