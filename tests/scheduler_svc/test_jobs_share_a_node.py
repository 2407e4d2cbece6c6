"""Two jobs on one node: commands say whom they are for, and a GPU has one running job.

Issue 28, case 10. Job a holds GPUs 0-3 of n0 as its ranks 0-3, job b GPUs 4-7 as its
ranks 0-3, and neither registers a communicator: every command is for comm 0 and rank
numbers both jobs use. Each command names its job and incarnation, and, as an agent takes
it, the rank numbers other jobs hold on the node (what the agent needs to tell a process
that named no job apart). A second job on a GPU a running job holds is refused, unless it
says it replaces that job.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from railover_testing import waiting
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine
from tests.scheduler_svc.helpers import Running, event, job_body, register_nodes, service_factory


def on_gpus(job_id: str, node: str, gpus: range, **overrides: Any) -> dict[str, Any]:
    """A job whose rank i runs on the i-th of `gpus` of `node`."""
    body = job_body(job_id, [node], **overrides)
    body["ranks"] = [{"rank": i, "node": node, "gpu": g} for i, g in enumerate(gpus)]
    return body


@pytest.fixture
def start(db_url: str) -> Iterator[Callable[..., Running]]:
    with service_factory(db_url, coordinator_interval_s=0.05) as factory:
        yield factory


def set_incarnation(db_url: str, job_id: str, incarnation: int) -> None:
    # The fleet manager's re-post sets it (services/registry.py); here it is set directly,
    # so that what is tested is that commands copy it, whatever set it.
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(update(m.Job).where(m.Job.job_id == job_id).values(incarnation=incarnation))
    engine.dispose()


def two_jobs(http: httpx.Client) -> None:
    register_nodes(http, ["n0"])
    for job_id, gpus in (("a", range(4)), ("b", range(4, 8))):
        r = http.post("/v1/jobs", json=on_gpus(job_id, "n0", gpus))
        assert r.status_code == 201, r.text


def test_a_restart_names_its_job_and_incarnation(
    start: Callable[..., Running], db_url: str
) -> None:
    http = start(command_ack_timeout_s=10**6).http
    two_jobs(http)
    set_incarnation(db_url, "a", 4)
    # 10 s after a's checkpoint: restarting is cheaper, so a's ranks on n0 are aborted.
    r = http.post("/v1/events", json={"events": [event("n0", device="mlx5_0", after_s=10)]})
    assert r.status_code == 202, r.text
    (abort,) = http.get("/v1/nodes/n0/commands").json()["commands"]
    assert (abort["kind"], abort["job_id"], abort["incarnation"]) == ("abort", "a", 4)
    assert (abort["comm_id"], abort["ranks"]) == (0, [0, 1, 2, 3])
    # The same rank numbers are b's on this node: a process that names no job and says
    # rank 2 could be either's, and the agent must not send it a's abort.
    assert abort["other_jobs_ranks"] == [0, 1, 2, 3]
    assert http.get("/v1/jobs/b/commands").json()["commands"] == []
    # The job's listing shows whom it is for too; what other jobs hold is the agent's alone.
    (listed,) = http.get("/v1/jobs/a/commands").json()["commands"]
    assert (listed["job_id"], listed["incarnation"], listed["other_jobs_ranks"]) == ("a", 4, None)


def test_a_job_alone_on_its_node_is_told_so_and_b_gets_only_its_own(
    start: Callable[..., Running],
) -> None:
    http = start(command_ack_timeout_s=10**6).http
    register_nodes(http, ["n0", "n1"])
    assert http.post("/v1/jobs", json=on_gpus("a", "n0", range(4))).status_code == 201
    assert http.post("/v1/jobs", json=on_gpus("b", "n1", range(4))).status_code == 201
    http.post("/v1/events", json={"events": [event("n0", device="mlx5_0", after_s=10)]})
    (abort,) = http.get("/v1/nodes/n0/commands").json()["commands"]
    assert (abort["job_id"], abort["incarnation"], abort["other_jobs_ranks"]) == ("a", 1, [])
    assert http.get("/v1/nodes/n1/commands").json()["commands"] == []


def test_a_retry_is_for_the_incarnation_the_command_was_for(
    start: Callable[..., Running], db_url: str
) -> None:
    http = start(command_ack_timeout_s=0.3, command_max_attempts=3).http
    two_jobs(http)
    set_incarnation(db_url, "a", 2)
    http.post("/v1/events", json={"events": [event("n0", device="mlx5_0", after_s=10)]})
    (first,) = http.get("/v1/jobs/a/commands").json()["commands"]
    assert (first["kind"], first["incarnation"]) == ("abort", 2)
    set_incarnation(db_url, "a", 3)  # a later incarnation: not whom the abort was for

    def retries() -> list[dict[str, Any]]:
        cmds: list[dict[str, Any]] = http.get("/v1/jobs/a/commands").json()["commands"]
        return [c for c in cmds if c["command_id"] != first["command_id"]]

    retry = waiting.wait_for("a retry of the unacknowledged abort", retries, 20)[0]
    assert (retry["kind"], retry["job_id"], retry["incarnation"]) == ("abort", "a", 2)


def test_the_stream_carries_whom_a_command_is_for(start: Callable[..., Running]) -> None:
    svc = start(command_ack_timeout_s=10**6)
    two_jobs(svc.http)
    svc.http.post("/v1/events", json={"events": [event("n0", device="mlx5_0", after_s=10)]})
    with (
        httpx.Client(base_url=svc.url, timeout=30) as c,
        c.stream("GET", "/v1/nodes/n0/commands/stream", params={"heartbeat_s": 1}) as r,
    ):
        assert r.status_code == 200
        data = None
        lines = r.iter_lines()
        for line in lines:
            if line == "event: command":
                data = next(line for line in lines if line.startswith("data: "))
                break
    assert data is not None
    cmd = json.loads(data.removeprefix("data: "))
    assert (cmd["job_id"], cmd["incarnation"], cmd["other_jobs_ranks"]) == ("a", 1, [0, 1, 2, 3])


def test_a_gpu_a_running_job_holds_is_refused_and_nothing_is_stored(
    start: Callable[..., Running],
) -> None:
    http = start().http
    register_nodes(http, ["n0", "n1"])
    assert http.post("/v1/jobs", json=job_body("a", ["n0"])).status_code == 201
    # The bug: exactly a's GPUs, under another id, was accepted.
    r = http.post("/v1/jobs", json=job_body("b", ["n0"]))
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["error"] == "conflict"
    assert "job 'a'" in body["detail"] and "GPU 0 of node 'n0'" in body["detail"]
    assert body["fields"][0]["field"] == "ranks.0.gpu"
    # One GPU in common is enough; the one named is the first rank on one.
    some = job_body("b", ["n1"], gpus=2)
    some["ranks"][1] = {"rank": 1, "node": "n0", "gpu": 7}
    r = http.post("/v1/jobs", json=some)
    assert r.status_code == 409 and r.json()["fields"][0]["field"] == "ranks.1.gpu"
    assert "GPU 7 of node 'n0'" in r.json()["detail"]
    assert http.get("/v1/jobs/b").status_code == 404
    assert [j["job_id"] for j in http.get("/v1/jobs").json()] == ["a"]
    # Another node, or the same node's other GPUs, is no conflict: jobs may share a node.
    assert http.post("/v1/jobs", json=job_body("c", ["n1"])).status_code == 201
    http.delete("/v1/jobs/c")
    half = on_gpus("a2", "n1", range(4))
    assert http.post("/v1/jobs", json=half).status_code == 201
    assert http.post("/v1/jobs", json=on_gpus("b2", "n1", range(4, 8))).status_code == 201


def test_replaces_ends_the_holder_and_takes_its_gpus(start: Callable[..., Running]) -> None:
    http = start(command_ack_timeout_s=10**6).http
    register_nodes(http, ["n0", "n1"])
    assert http.post("/v1/jobs", json=job_body("a", ["n0"])).status_code == 201
    # Long after a's checkpoint: a fails over, and its commands wait for n0's agent.
    http.post("/v1/events", json={"events": [event("n0", device="mlx5_0", after_s=3000)]})
    assert http.get("/v1/jobs/a/commands").json()["commands"]
    r = http.post("/v1/jobs", json=job_body("b", ["n0"], replaces="a"))
    assert r.status_code == 201, r.text
    # Ended as DELETE ends a job: gone, and its commands with it.
    assert http.get("/v1/jobs/a").status_code == 404
    assert [j["job_id"] for j in http.get("/v1/jobs").json()] == ["b"]
    assert all(c["job_id"] == "b" for c in http.get("/v1/nodes/n0/commands").json()["commands"])
    # A replaces naming a job that is gone ends nothing: b still holds the GPUs ...
    r = http.post("/v1/jobs", json=job_body("c", ["n0"], replaces="a"))
    assert r.status_code == 409 and "job 'b'" in r.json()["detail"]
    # ... and where nobody holds them, the job is placed.
    assert http.post("/v1/jobs", json=job_body("c", ["n1"], replaces="a")).status_code == 201
    r = http.post("/v1/jobs", json=job_body("d", ["n0"], replaces="d"))
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "replaces"


def test_replacing_one_holder_leaves_the_other_in_the_way(start: Callable[..., Running]) -> None:
    http = start().http
    register_nodes(http, ["n0"])
    assert http.post("/v1/jobs", json=on_gpus("a", "n0", range(4))).status_code == 201
    assert http.post("/v1/jobs", json=on_gpus("b", "n0", range(4, 8))).status_code == 201
    r = http.post("/v1/jobs", json=job_body("c", ["n0"], replaces="a"))
    assert r.status_code == 409 and "job 'b'" in r.json()["detail"]
    # Refused whole: a, which it would have replaced, is still there.
    assert [j["job_id"] for j in http.get("/v1/jobs").json()] == ["a", "b"]


def test_a_restarting_job_holds_no_gpus_until_it_is_posted_again(
    start: Callable[..., Running],
) -> None:
    http = start(command_ack_timeout_s=10**6).http
    register_nodes(http, ["n0", "n1"])
    assert http.post("/v1/jobs", json=job_body("a", ["n0"])).status_code == 201
    http.post("/v1/events", json={"events": [event("n0", device="mlx5_0", after_s=10)]})
    assert http.get("/v1/jobs/a").json()["mode"] == "restarting"
    # Its processes were told to abort: the fleet manager may place another job there ...
    assert http.post("/v1/jobs", json=job_body("b", ["n0"])).status_code == 201
    # ... and a's new incarnation may not come back onto b's GPUs, but may go elsewhere.
    r = http.post("/v1/jobs", json=job_body("a", ["n0"]))
    assert r.status_code == 409 and "job 'b'" in r.json()["detail"]
    assert http.post("/v1/jobs", json=job_body("a", ["n1"])).status_code == 201


def test_two_posts_at_once_onto_one_gpu_place_one_job(start: Callable[..., Running]) -> None:
    svc = start()
    register_nodes(svc.http, ["n0"])
    statuses: list[int] = []
    barrier = threading.Barrier(2)

    def post(job_id: str) -> None:
        with httpx.Client(base_url=svc.url, timeout=30) as c:
            barrier.wait()
            statuses.append(c.post("/v1/jobs", json=job_body(job_id, ["n0"])).status_code)

    threads = [threading.Thread(target=post, args=(j,)) for j in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(statuses) == [201, 409]
    assert len(svc.http.get("/v1/jobs").json()) == 1
