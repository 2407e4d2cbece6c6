"""Commands: long-poll delivery to the right node and per-rank acknowledgement."""

from __future__ import annotations

import threading

import httpx

from tests.scheduler_svc.helpers import event, job_body, register_nodes


def test_failover_command_reaches_node_and_is_acked(http: httpx.Client, service: str) -> None:
    register_nodes(http, ["n0", "n1"])
    http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"], communicators=[{"comm_id": 5}]))
    assert http.get("/v1/nodes/n0/commands").json() == {"commands": []}

    got: dict[str, object] = {}

    def poll() -> None:
        with httpx.Client(base_url=service, timeout=30) as c:
            got["body"] = c.get("/v1/nodes/n1/commands", params={"wait_s": 20}).json()

    # Whether the poll is already waiting when the fault commits or looks after it, it
    # returns the commands; that a waiting poll is woken by the commit (and not by its
    # re-check) is tests/scheduler_svc/test_delivery.py's to show.
    waiter = threading.Thread(target=poll)
    waiter.start()
    http.post("/v1/events", json={"events": [event("n1", device="mlx5_6", after_s=3000)]})
    waiter.join(timeout=30)
    cmds = got["body"]["commands"]  # type: ignore[index]
    assert [c["kind"] for c in cmds] == ["failover", "balance"]
    cmd = cmds[0]
    assert (cmd["kind"], cmd["ranks"], cmd["state"]) == ("failover", [14], "delivered")
    # The channels that left through the lost rail are disabled at one op count everywhere.
    rebalance = cmds[1]
    assert rebalance["ranks"] == list(range(8, 16))
    assert rebalance["disabled_channels"] == [6]
    # R²CCL balance: channel 6 leaves through mlx5_6's backup, mlx5_7, with channel 7;
    # each of the 7 RNICs left carries a seventh, split among its channels.
    assert rebalance["channel_weights"] == [1 / 7] * 6 + [1 / 14] * 2
    assert rebalance["split_ratio"] == (1 - 7 / 8) / (1 + 7 / 8)
    assert rebalance["ops_done"] == 20  # no progress reported yet: the minimum offset
    on_n0 = http.get("/v1/nodes/n0/commands").json()["commands"]
    # Epochs count per communicator over every kind: the failover took 1.
    assert [(c["kind"], c["ops_done"], c["epoch"]) for c in on_n0] == [("balance", 20, 2)]

    # Handed out once; an agent that restarts asks for the unacknowledged ones again.
    assert http.get("/v1/nodes/n1/commands").json() == {"commands": []}
    again = http.get("/v1/nodes/n1/commands", params={"include_unacked": "true"}).json()
    assert [c["command_id"] for c in again["commands"]] == [
        cmd["command_id"],
        rebalance["command_id"],
    ]
    r = http.post(
        f"/v1/commands/{cmd['command_id']}/acks",
        json={"node": "n1", "rank": 14, "status": "applied"},
    )
    assert r.status_code == 200 and r.json()["state"] == "applied"
    unacked = http.get("/v1/nodes/n1/commands", params={"include_unacked": "true"}).json()
    assert [c["kind"] for c in unacked["commands"]] == ["balance"]

    bad = http.post(
        f"/v1/commands/{cmd['command_id']}/acks", json={"node": "n0", "status": "applied"}
    )
    assert bad.status_code == 422 and "n1" in bad.json()["detail"]
    bad = http.post(
        f"/v1/commands/{cmd['command_id']}/acks",
        json={"node": "n1", "rank": 3, "status": "applied"},
    )
    assert bad.status_code == 422
    assert (
        http.post("/v1/commands/999/acks", json={"node": "n1", "status": "applied"}).status_code
        == 404
    )


def test_abort_needs_every_rank(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1"])
    http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"]))
    http.post("/v1/events", json={"events": [event("n0", after_s=10)]})
    cmd = http.get("/v1/nodes/n0/commands").json()["commands"][0]
    assert cmd["kind"] == "abort"
    assert cmd["ranks"] == list(range(8))
    for rank in range(7):
        r = http.post(
            f"/v1/commands/{cmd['command_id']}/acks",
            json={"node": "n0", "rank": rank, "status": "applied"},
        )
        assert r.json()["state"] == "delivered"
    r = http.post(
        f"/v1/commands/{cmd['command_id']}/acks",
        json={"node": "n0", "rank": 7, "status": "applied"},
    )
    assert r.json()["state"] == "applied"


def test_one_ack_speaks_for_several_ranks(http: httpx.Client) -> None:
    """The agent's aggregate: one request for the ranks of a node that answered alike."""
    register_nodes(http, ["n0", "n1"])
    http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"]))
    http.post("/v1/events", json={"events": [event("n0", after_s=10)]})
    cmd = http.get("/v1/nodes/n0/commands").json()["commands"][0]
    url = f"/v1/commands/{cmd['command_id']}/acks"
    for bad, field in (
        ({"rank": 1, "ranks": [2]}, "either rank or ranks"),
        ({"ranks": [2, 2]}, "every rank must appear once"),
        ({"ranks": []}, "ranks"),
        ({"ranks": [1, 9]}, "rank 9 is not addressed"),
    ):
        r = http.post(url, json={"node": "n0", "status": "applied", **bad})
        assert r.status_code == 422 and field in r.text, (bad, r.text)
    # Nothing of a refused ack was kept: seven ranks still leave the command waiting.
    r = http.post(url, json={"node": "n0", "ranks": list(range(7)), "status": "applied"})
    assert (r.status_code, r.json()["state"]) == (200, "delivered")
    r = http.post(url, json={"node": "n0", "ranks": [7], "status": "applied"})
    assert r.json()["state"] == "applied"


def test_command_ids_are_never_reused(http: httpx.Client) -> None:
    # Agents remember command ids they handled; a reused id would be taken for an old one.
    register_nodes(http, ["n0", "n1"])
    http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"]))
    http.post("/v1/events", json={"events": [event("n0", after_s=10)]})
    first = max(c["command_id"] for c in http.get("/v1/jobs/j1/commands").json()["commands"])
    assert http.delete("/v1/jobs/j1").status_code == 204
    http.post("/v1/events", json={"events": [event("n0", "port_up", after_s=20)]})
    http.post("/v1/jobs", json=job_body("j2", ["n0", "n1"]))
    http.post("/v1/events", json={"events": [event("n0", after_s=30)]})
    later = min(c["command_id"] for c in http.get("/v1/jobs/j2/commands").json()["commands"])
    assert later > first


def test_commands_name_the_jobs_communicator_on_shared_nodes(http: httpx.Client) -> None:
    # Two jobs on the same nodes use the same rank numbers; only comm_id tells them apart.
    register_nodes(http, ["n0", "n1"])
    for job, comm, gpus in (("a", 11, range(4)), ("b", 22, range(4, 8))):
        body = job_body(job, ["n0", "n1"], communicators=[{"comm_id": comm}])
        body["ranks"] = [
            {"rank": i * 4 + j, "node": n, "gpu": g}
            for i, n in enumerate(["n0", "n1"])
            for j, g in enumerate(gpus)
        ]
        assert http.post("/v1/jobs", json=body).status_code == 201
    http.post("/v1/events", json={"events": [event("n0", device="mlx5_5", after_s=10)]})
    aborts = [c for c in http.get("/v1/jobs/b/commands").json()["commands"] if c["kind"] == "abort"]
    assert {(c["node"], c["comm_id"]) for c in aborts} == {("n0", 22), ("n1", 22)}
    assert http.get("/v1/jobs/a/commands").json()["commands"] == []


def test_no_switch_point_without_a_registered_communicator(http: httpx.Client) -> None:
    # Without a communicator there is no comm_id to address nor progress to count from:
    # the plan is on record, the ranks fail over by s-Bond alone.
    register_nodes(http, ["n0", "n1"])
    http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"]))
    http.post("/v1/events", json={"events": [event("n1", device="mlx5_6", after_s=3000)]})
    kinds = [c["kind"] for c in http.get("/v1/jobs/j1/commands").json()["commands"]]
    assert kinds == ["failover"]
    (decision,) = http.get("/v1/jobs/j1/decisions").json()["decisions"]
    assert decision["plan"]["communicators"][0]["disabled_channels"] == [6]
