"""A simulated day of a 1,024-GPU job whose NIC stays broken (issue 28, Done when).

FlowCheck gives the job a checkpoint every iteration, and the fleet manager restarts it
on the same nodes when told to. Over the day the service must decide the failover and at
most one restart for that fault, and nothing else: the incarnation placed back on the
broken NIC runs failed over, and none of its checkpoints restarts it again.
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
from tests.scheduler_svc.test_fault_lifecycle_api import T0, decisions

NODES = [f"n{i:03d}" for i in range(128)]  # x 8 GPUs = 1,024 ranks
DAY_S = 86_400
# One FlowCheck checkpoint per iteration; a day of 4-minute iterations (350 of them after
# the fault) keeps the test short.
ITERATION_S = 240


@pytest.fixture
def running(db_url: str) -> Iterator[tuple[httpx.Client, ManualClock]]:
    clock = ManualClock(T0)
    with service_factory(db_url, coordinator=False, command_ack_timeout_s=10**6) as start:
        http = start(clock=clock).http
        register_nodes(http, NODES)
        yield http, clock


def job(**kw: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "last_checkpoint_at": T0.isoformat(),
        "checkpoint_interval_s": 3600,
        "communicators": [{"comm_id": 77, "channels": 16}],
        "repair_estimate_s": 7 * 86_400,  # the NIC is not repaired within the day
    }
    return job_body("big", NODES, **(fields | kw))


def test_a_day_on_a_broken_nic_is_one_failover_and_at_most_one_restart(
    running: tuple[httpx.Client, ManualClock],
) -> None:
    http, clock = running
    assert http.post("/v1/jobs", json=job()).status_code == 201
    clock.advance(2400)  # 40 minutes in: past the failover threshold
    post(http, ev("n017", "port_down", clock(), device="mlx5_3"))
    iteration = 0
    executed: set[str] = set()  # the restart decisions the fleet manager has carried out
    while clock() < T0 + timedelta(seconds=DAY_S):
        clock.advance(ITERATION_S)
        iteration += 1
        # The fleet manager acts on the newest decision (the job's own view carries its
        # 1,024 ranks: reading it every iteration was most of this test's time).
        newest = http.get("/v1/jobs/big/decisions", params={"limit": 1}).json()["decisions"]
        if newest and newest[0]["action"] == "restart" and newest[0]["decision_id"] not in executed:
            assert http.get("/v1/jobs/big").json()["mode"] == "restarting"
            # The fleet manager restarts it at once, on the same nodes.
            executed.add(newest[0]["decision_id"])
            r = http.post("/v1/jobs", json=job(last_checkpoint_at=clock().isoformat()))
            assert r.status_code == 201, r.text
            continue
        cp = {"at": clock().isoformat(), "kind": "flowcheck", "iteration": iteration}
        assert http.post("/v1/jobs/big/checkpoints", json=cp).status_code == 201
    actions = [d["action"] for d in reversed(decisions(http, "big"))]
    # The failover; at the first checkpoint a restart onto a spare (a week of repair
    # ahead); the incarnation placed back on the same nodes failed over once more.
    assert actions == ["failover", "restart", "failover"], actions
    assert len(executed) == 1
    assert iteration == (DAY_S - 2400) // ITERATION_S  # the rest of the day, iteration by iteration
    final = http.get("/v1/jobs/big").json()
    assert final["mode"] == "failed_over"
    assert final["incarnation"] == 1 + len(executed)
