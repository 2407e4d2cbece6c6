"""Issue 28, case by case: the restarts that do not end, over the service's HTTP API.

The cases of test_sequences_regressions.py where a job restarts again and again, or the
restart of one incarnation ends or aborts another: one restart per fault and placement, an
ended incarnation's checkpoint, a refused failover or optional mitigation, an agent
reachable again. Each runs on a manual clock, on SQLite and PostgreSQL, on the nodes that
module's docstring describes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest

from tests.scheduler_svc.helpers import job_body, register_nodes
from tests.scheduler_svc.sequences import (
    COMM,
    T0,
    Start,
    ack,
    active,
    checkpoint,
    commands,
    decisions,
    ev,
    faults,
    job,
    poll,
    post,
    post_job,
    restarted_at_a_checkpoint,
    settle,
    wait_for,
)

# --- restarts that do not end ---------------------------------------------------------------


@pytest.mark.parametrize(
    "then",
    [
        "checkpoints",
        "repost_same_nodes",
    ],
)
def test_case06_one_restart_per_fault_and_placement(make: Start, then: str) -> None:
    """n0/mlx5_3 fails for good (repair in a day): the job fails over, and its first
    checkpoint restarts it (reload 600 s < 12 h lost at k = 1.5). The restarted incarnation
    comes back on the same nodes, where the fault still is: it runs failed over, with one
    decision saying so, and 20 FlowCheck checkpoints later it has not been restarted again.

    checkpoints: the new incarnation's checkpoints are its only word that it runs.
    repost_same_nodes: the fleet manager posts it again on n0 and n1 first.
    """
    http, clock = make()
    at = restarted_at_a_checkpoint(http, clock)
    assert job(http, "j")["mode"] == "restarting"
    aborts = len(commands(http, "j", "abort"))
    if then == "repost_same_nodes":
        clock.advance(30)
        again = post_job(http, "j", ["n0", "n1"], comm=COMM, last_checkpoint_at=at)
        assert again["mode"] == "failed_over"
    for _ in range(20):
        at = clock.advance(6)
        checkpoint(http, "j", at, kind="flowcheck")
    history = decisions(http, "j")
    assert [d["action"] for d in history] == ["failover", "restart", "failover"], [
        (d["action"], d["reason"]) for d in history
    ]
    assert "backup" in history[0]["reason"]  # the one decision: it runs failed over
    assert len(commands(http, "j", "abort")) == aborts
    assert job(http, "j")["mode"] == "failed_over"
    assert active(http, "j", 3) == "mlx5_2/1"
    if then == "repost_same_nodes":
        assert job(http, "j")["incarnation"] == 2


@pytest.mark.parametrize(
    "late",
    [
        "checkpoint_of_the_aborted_incarnation",
        "aborts_of_the_ended_incarnation",
    ],
)
def test_case07_an_ended_incarnation_neither_ends_nor_aborts_the_next(
    make: Start, late: str
) -> None:
    """A fault 100 s after a checkpoint restarts the job (ABORT to n0 and n1, not yet acked).

    checkpoint_of_the_aborted_incarnation: a checkpoint taken at T0-50, before the restart
    decision, arrives late: it is the aborted incarnation's, so the job stays restarting
    and is told nothing more; the fleet manager's re-post is incarnation 2.
    aborts_of_the_ended_incarnation: the fleet manager posts the job again on the same
    nodes; the old incarnation's ABORTs are never handed to the new processes, neither
    as they are nor re-issued after their ack deadline.
    """
    http, clock = make(command_ack_timeout_s=30)
    register_nodes(http, ["n0", "n1"])
    post_job(http, "j", ["n0", "n1"], comm=COMM, elapsed_s=100)
    post(http, ev("n0", "port_down", T0))
    assert [d["action"] for d in decisions(http, "j")] == ["restart"]
    issued = len(commands(http, "j"))
    assert {c["kind"] for c in commands(http, "j")} == {"abort"}
    clock.advance(5)
    if late == "checkpoint_of_the_aborted_incarnation":
        checkpoint(http, "j", T0 - timedelta(seconds=50))
        assert job(http, "j")["mode"] == "restarting"
        assert len(commands(http, "j")) == issued
        assert [d["action"] for d in decisions(http, "j")] == ["restart"]
        again = post_job(http, "j", ["n0", "n1"], comm=COMM, last_checkpoint_at=T0)
        assert again["incarnation"] == 2
        return
    again = post_job(http, "j", ["n0", "n1"], comm=COMM, last_checkpoint_at=T0)
    assert again["mode"] == "failed_over"
    for node in ("n0", "n1"):
        handed = poll(http, node)
        assert all(c["kind"] != "abort" for c in handed), handed
    assert commands(http, "j", "abort", live=True) == []
    clock.advance(31)  # past every ack deadline
    settle(http)
    assert commands(http, "j", "abort", live=True) == []
    assert len(commands(http, "j", "abort")) == 2  # the two of the restart, no re-issue
    assert again["incarnation"] == 2
    assert {c["incarnation"] for c in commands(http, "j", live=True)} == {2}


def failovers(http: httpx.Client, n: int) -> Callable[[], bool]:
    return lambda: len(commands(http, "j", "failover")) == n


FOUR = ["n0", "n1", "n2", "n3"]


def repost(http: httpx.Client, nodes: list[str]) -> dict[str, Any]:
    """The fleet manager starts the restarted job again, on `nodes`."""
    return post_job(http, "j", nodes, comm=COMM)


def restarted_without_a_path(http: httpx.Client) -> None:
    """rail3-leaf fails (n0, n2 and n3 report mlx5_3 down; n1 does not), then n0's backup
    for GPU 3, mlx5_2, exceeds its retries: rank 3 has no path left, so the job restarts."""
    register_nodes(http, FOUR)
    post_job(http, "j", FOUR, comm=COMM)
    post(http, *(ev(n, "port_down", T0) for n in ("n0", "n2", "n3")))
    post(http, ev("n0", "cqe_error", T0 + timedelta(seconds=1), device="mlx5_2", wc_status=12))
    assert [d["action"] for d in decisions(http, "j")] == ["restart", "failover"]


def test_case06_back_on_the_hardware_it_was_restarted_for_the_job_is_not_restarted_again(
    make: Start,
) -> None:
    """Placed back on the same four nodes, rank 3 still has no path: the new incarnation
    runs on what is left with one decision saying so, and the reports that follow (the
    same evidence, again and again) restart it no more."""
    http, clock = make()
    restarted_without_a_path(http)
    clock.advance(5)
    assert repost(http, FOUR)["incarnation"] == 2
    after = decisions(http, "j")
    assert [d["action"] for d in after] == ["failover", "restart", "failover"]
    assert "not restarted again" in after[0]["reason"]
    assert job(http, "j")["mode"] == "failed_over"
    for i in range(3):
        clock.advance(1)
        at = T0 + timedelta(seconds=7 + i)
        post(http, ev("n0", "cqe_error", at, device="mlx5_2", wc_status=12))
    settle(http)
    assert len(decisions(http, "j")) == 3
    assert commands(http, "j", "abort", live=True) == []


def test_case06_a_failover_refused_restarts_once_and_the_reposted_job_runs_on(
    make: Start,
) -> None:
    """rail2-leaf fails, inferred from n1-n3; n0 (which never reported) refuses its
    FAILOVER. That restarts the job (n0 counts unreachable); the re-post on the same
    nodes is not restarted again for it, and its processes are told what to do."""
    http, clock = make()
    register_nodes(http, FOUR)
    post_job(http, "j", FOUR, comm=COMM)
    post(http, *(ev(n, "port_down", T0, device="mlx5_2") for n in FOUR[1:]))
    (refused,) = [c for c in commands(http, "j", "failover", live=True) if c["node"] == "n0"]
    ack(http, refused, "failed", detail="plugin ABI 1")
    assert [d["action"] for d in decisions(http, "j")] == ["restart", "failover"]
    clock.advance(5)
    repost(http, FOUR)
    assert [d["action"] for d in decisions(http, "j")] == ["failover", "restart", "failover"]
    told = commands(http, "j", live=True)
    assert told and {c["incarnation"] for c in told} == {2}
    assert {c["kind"] for c in told} == {"failover"}
    settle(http)
    assert len(decisions(http, "j")) == 3


def test_case07_a_restart_of_the_next_incarnation_aborts_its_own_processes(
    make: Start,
) -> None:
    """While the job restarts, n1's GPU 3 loses both its RNICs. The re-post lands on
    three old nodes and a spare, n1 among them: the new incarnation has no path for rank
    11 and restarts at once, and the ABORTs go to its processes, incarnation 2."""
    http, clock = make()
    restarted_without_a_path(http)
    register_nodes(http, ["n4"])
    clock.advance(1)
    at = T0 + timedelta(seconds=2)
    post(http, ev("n1", "port_down", at), ev("n1", "port_down", at, device="mlx5_2"))
    clock.advance(5)
    repost(http, ["n4", "n1", "n2", "n3"])
    assert [d["action"] for d in decisions(http, "j")] == ["restart", "restart", "failover"]
    assert job(http, "j")["mode"] == "restarting"
    aborts = commands(http, "j", "abort", live=True)
    assert sorted(c["node"] for c in aborts) == ["n1", "n2", "n3", "n4"]
    assert {c["incarnation"] for c in aborts} == {2}


def test_case08_a_node_is_reachable_again_when_its_agent_polls_or_acks(make: Start) -> None:
    """n0's agent is cut off: the FAILOVER for rank 3 goes unacknowledged through all its
    attempts, n0 counts as unreachable and the job restarts. The partition heals: n0's
    agent polls (it is handed the ABORT) and acks it. From then n0 is reachable, so the
    re-posted incarnation on n0 and n1 runs (failed over: mlx5_3 is still down) rather than
    restarting at once."""
    http, clock = make(command_ack_timeout_s=10, command_max_attempts=3)
    register_nodes(http, ["n0", "n1"])
    post_job(http, "j", ["n0", "n1"], comm=COMM)
    post(http, ev("n0", "port_down", T0))
    assert decisions(http, "j")[0]["action"] == "failover"
    for attempt in (2, 3):  # re-issued under a new id each time its deadline passes
        clock.advance(11)
        wait_for(f"attempt {attempt} of the failover", failovers(http, attempt))
    clock.advance(11)
    wait_for("the restart", lambda: decisions(http, "j")[0]["action"] == "restart")
    assert [f["node"] for f in faults(http) if f["kind"] == "unreachable"] == ["n0"]
    handed = poll(http, "n0")
    assert [c["kind"] for c in handed] == ["abort"]
    for c in handed:
        ack(http, c, "applied")
    assert [f for f in faults(http) if f["kind"] == "unreachable"] == []
    clock.advance(30)
    again = post_job(http, "j", ["n0", "n1"], comm=COMM, last_checkpoint_at=clock())
    assert again["mode"] == "failed_over"
    assert decisions(http, "j")[0]["action"] == "failover"
    assert active(http, "j", 3) == "mlx5_2/1"
    assert again["incarnation"] == 2


def restarts(http: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    return [d for d in decisions(http, job_id) if d["action"] in ("restart", "restart_scaled")]


@pytest.mark.parametrize(
    "refused",
    [
        "nvl_transit",
        "failback",
    ],
)
def test_case09_a_refused_optional_mitigation_falls_back_without_a_restart(
    make: Start, refused: str
) -> None:
    """A rank refuses a command it could do without: the job keeps running on s-Bond.

    nvl_transit: 4 RNICs per node (one per PCIe switch and root complex); ranks on GPU 2 of
    nvl0 and nvl1 in communicator 78. nvl0/mlx5_1 fails; the backup mlx5_0 is behind another
    root complex, so the plan is NVL transit through GPU 0. The agent's plugin is of ABI 1
    and cannot take it: the rank stays on s-Bond alone (FAILOVER applied), nothing is
    unreachable, nothing restarts.
    failback: n0/mlx5_3 fails and comes back; after the damping the FAILBACK is acked
    failed on n0. The job stays failed over on its backups and is told again after
    another damping period.
    """
    http, clock = make()
    if refused == "nvl_transit":
        # Names of their own: plans are cached by node, registration time and version,
        # which another test's 8-rail n0 on the same clock shares.
        register_nodes(http, ["nvl0", "nvl1"], rails=4)
        body = job_body(
            "j",
            ["nvl0", "nvl1"],
            last_checkpoint_at=(T0 - timedelta(seconds=3000)).isoformat(),
            communicators=[{"comm_id": 78, "channels": 4}],
        )
        body["ranks"] = [
            {"rank": 0, "node": "nvl0", "gpu": 2},
            {"rank": 1, "node": "nvl1", "gpu": 2},
        ]
        r = http.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        post(http, ev("nvl0", "port_down", T0, device="mlx5_1"))
        (nvl,) = commands(http, "j", "nvl_transit")
        (over,) = commands(http, "j", "failover")
        ack(http, over, "applied")
        ack(
            http,
            nvl,
            "failed",
            detail="unsupported: 1 plugin client(s) for comm_id 78 on this node predate ABI 2 "
            "(nvl_transit)",
        )
        moved, to = 0, "mlx5_0/1"
    else:
        register_nodes(http, ["n0", "n1"])
        post_job(http, "j", ["n0", "n1"], comm=COMM)
        post(http, ev("n0", "port_down", T0))
        for c in commands(http, "j", live=True):
            ack(http, c, "applied")
        clock.advance(10)
        post(http, ev("n0", "port_up", T0 + timedelta(seconds=10)))
        clock.advance(61)
        wait_for("the fail-back", lambda: commands(http, "j", "failback", live=True))
        first = commands(http, "j", "failback", live=True)
        # n0's ranks cannot return; without them no rank applies the switch point.
        (on_n0,) = [c for c in first if c["node"] == "n0"]
        ack(http, on_n0, "failed", detail="no primary QP")
        moved, to = 3, "mlx5_2/1"
    assert restarts(http, "j") == []
    assert [f for f in faults(http) if f["kind"] == "unreachable"] == []
    assert commands(http, "j", "abort") == []
    assert job(http, "j")["mode"] == "failed_over"
    assert active(http, "j", moved) == to
    if refused == "failback":
        epoch = max(c["epoch"] for c in first)

        def later() -> list[dict[str, Any]]:
            return [c for c in commands(http, "j", "failback", live=True) if c["epoch"] > epoch]

        settle(http)
        assert later() == []  # not at once: after the damping
        clock.advance(61)
        wait_for("the fail-back again", lambda: len(later()) == 2, lambda: commands(http, "j"))
        assert {c["node"] for c in later()} == {"n0", "n1"}
        assert restarts(http, "j") == []
