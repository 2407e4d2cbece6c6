"""A job's commands narrowed by state: what a fleet manager (and the fleet twin) asks to see
what is still waiting, without reading the job's whole history of commands."""

from __future__ import annotations

import httpx

from tests.scheduler_svc.helpers import event, job_body, register_nodes

NODES = ["n0", "n1"]


def states(http: httpx.Client, *wanted: str) -> list[tuple[str, str]]:
    r = http.get("/v1/jobs/j/commands", params={"state": list(wanted)})
    assert r.status_code == 200, r.text
    return [(c["node"], c["state"]) for c in r.json()["commands"]]


def test_commands_are_narrowed_to_the_states_asked_for(http: httpx.Client) -> None:
    register_nodes(http, NODES)
    body = job_body("j", NODES, communicators=[{"comm_id": 7, "channels": 16}])
    assert http.post("/v1/jobs", json=body).status_code == 201
    fault = event("n1", device="mlx5_3", after_s=10)
    assert http.post("/v1/events", json={"events": [fault]}).status_code == 202
    everything = states(http)
    assert everything and {s for _, s in everything} == {"issued"}
    assert {n for n, _ in everything} == set(NODES)

    taken = http.get("/v1/nodes/n0/commands").json()["commands"]  # n0's agent takes its own
    assert taken and {c["node"] for c in taken} == {"n0"}
    every_id = {c["command_id"] for c in http.get("/v1/jobs/j/commands").json()["commands"]}
    assert {c["command_id"] for c in taken} < every_id

    assert states(http, "issued") == [(n, s) for n, s in everything if n == "n1"]
    assert states(http, "delivered") == [("n0", "delivered")] * len(taken)
    both = states(http, "issued", "delivered")
    assert sorted(both) == sorted(states(http)) and len(both) == len(everything)
    assert states(http, "applied") == []


def test_an_unknown_state_is_refused_naming_it(http: httpx.Client) -> None:
    register_nodes(http, NODES)
    assert http.post("/v1/jobs", json=job_body("j", NODES)).status_code == 201
    r = http.get("/v1/jobs/j/commands", params={"state": "done"})
    assert r.status_code == 422
    assert "state" in r.text and "issued" in r.text
    assert http.get("/v1/jobs/nope/commands", params={"state": "issued"}).status_code == 404
