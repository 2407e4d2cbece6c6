"""Issue 28, case by case: each sequence that leads the service wrong, over its HTTP API.

Every test reproduces one case of the issue on a manual clock, on SQLite and PostgreSQL,
and asserts what the service should do (each was written failing, as a strict xfail,
before its fix landed).

Two nodes of 8 GPUs (hgx_node): rank r is GPU r % 8 of node n(r // 8); GPU g's primary is
mlx5_g on switch rail<g>-leaf, its backup the other RNIC behind its PCIe switch (GPU 3:
mlx5_2, GPU 5: mlx5_4), on another rail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from railover_testing.local import ManualClock
from tests.scheduler_svc.helpers import job_body, register_nodes
from tests.scheduler_svc.sequences import (
    T0,
    Start,
    ack,
    commands,
    decisions,
    ev,
    faults,
    get,
    job,
    paths,
    poll,
    post,
    services,
    settle,
    wait_for,
)


@pytest.fixture
def make(db_url: str) -> Iterator[Start]:
    with services(db_url) as started:
        yield started


def post_job(
    http: httpx.Client,
    job_id: str,
    nodes: list[str],
    *,
    elapsed_s: float = 3000,
    last_checkpoint_at: datetime | None = None,
    comm: dict[str, Any] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """Post a job whose last checkpoint was `elapsed_s` before T0 (50 min into an hour:
    failing over beats restarting) or at `last_checkpoint_at`; `comm` its one communicator."""
    at = last_checkpoint_at or T0 - timedelta(seconds=elapsed_s)
    body = job_body(
        job_id,
        nodes,
        last_checkpoint_at=at.isoformat(),
        communicators=[] if comm is None else [comm],
        **kw,
    )
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


COMM = {"comm_id": 77, "channels": 16}


def active(http: httpx.Client, job_id: str, rank: int) -> str | None:
    """The RNIC port rank `rank` uses now, as /paths says."""
    row = paths(http, job_id)["ranks"][rank]
    assert row["rank"] == rank
    out: str | None = row["active"]
    return out


def port_state(http: httpx.Client, node: str, device: str) -> str:
    """The port's state as GET /v1/nodes/{node} shows it."""
    (row,) = [r for r in get(http, f"/v1/nodes/{node}")["rnics"] if r["name"] == device]
    out: str = row["state"]
    return out


def ranks_of(cmds: list[dict[str, Any]]) -> set[int]:
    return {r for c in cmds for r in c["ranks"]}


# --- commands onto dead hardware -------------------------------------------------------------


def test_case01_port_down_after_a_cqe_error_keeps_the_port_down(make: Start) -> None:
    """A CQE error (retry exceeded) on n0/mlx5_3, then port_down on the same port: the port
    is DOWN, so neither the CQE fault's quiet period nor anything else may move rank 3
    back onto it."""
    http, clock = make()
    register_nodes(http, ["n0", "n1"])
    post_job(http, "j", ["n0", "n1"], comm=COMM)
    post(http, ev("n0", "cqe_error", T0, wc_status=12))
    assert [d["action"] for d in decisions(http, "j")] == ["failover"]
    clock.advance(1)
    post(http, ev("n0", "port_down", T0 + timedelta(seconds=1)))
    clock.advance(301)  # past the CQE fault's quiet period
    settle(http)
    assert [d["action"] for d in decisions(http, "j")] == ["failover"]
    assert commands(http, "j", "failback") == []
    assert active(http, "j", 3) == "mlx5_2/1"
    assert job(http, "j")["mode"] == "failed_over"
    assert any(f["node"] == "n0" and f["device"] == "mlx5_3" for f in faults(http))
    assert port_state(http, "n0", "mlx5_3") == "DOWN"


@pytest.mark.parametrize(
    "order",
    [
        "up_observed_before_down",
        "late_down_between",
    ],
)
def test_case02_reports_count_by_when_they_were_observed(make: Start, order: str) -> None:
    """Reports arriving out of order: what counts is the newest observation of the port.

    up_observed_before_down: down at T0, then an up observed at T0-10 arrives; the port is
    still DOWN, so the job stays failed over past any damping.
    late_down_between: down at T0, up at T0+20, the job fails back after the damping; then
    a down observed at T0+10 arrives: older than the up, it changes nothing.
    """
    http, clock = make()
    register_nodes(http, ["n0", "n1"])
    post_job(http, "j", ["n0", "n1"], comm=COMM)
    post(http, ev("n0", "port_down", T0))
    if order == "up_observed_before_down":
        clock.advance(5)
        post(http, ev("n0", "port_up", T0 - timedelta(seconds=10)))
        clock.advance(120)  # twice the damping
        settle(http)
        assert [d["action"] for d in decisions(http, "j")] == ["failover"]
        assert commands(http, "j", "failback") == []
        assert active(http, "j", 3) == "mlx5_2/1"
        assert job(http, "j")["mode"] == "failed_over"
        return
    clock.advance(20)
    post(http, ev("n0", "port_up", T0 + timedelta(seconds=20)))
    clock.advance(61)
    wait_for("the fail-back", lambda: decisions(http, "j")[0]["action"] == "failback")
    before = len(decisions(http, "j"))
    late = post(http, ev("n0", "port_down", T0 + timedelta(seconds=10)))
    assert late["faults_opened"] == 0
    settle(http)
    assert len(decisions(http, "j")) == before
    assert active(http, "j", 3) == "mlx5_3/1"
    assert job(http, "j")["mode"] == "normal"
    assert faults(http) == []


def test_case03_partial_failback_tells_only_the_ranks_that_return(make: Start) -> None:
    """No registered communicator: n0/mlx5_3 (rank 3) and n1/mlx5_5 (rank 13) fail, and
    n0/mlx5_3 returns. Only rank 3 is told to return; rank 13 stays on its backup."""
    http, clock = make()
    register_nodes(http, ["n0", "n1"])
    post_job(http, "j", ["n0", "n1"])
    post(http, ev("n0", "port_down", T0), ev("n1", "port_down", T0, device="mlx5_5"))
    assert decisions(http, "j")[0]["action"] == "failover"
    clock.advance(10)
    post(http, ev("n0", "port_up", T0 + timedelta(seconds=10)))
    clock.advance(61)
    wait_for("the fail-back", lambda: decisions(http, "j")[0]["action"] == "failback")
    back = decisions(http, "j")[0]
    assert [r["rank"] for r in back["plan"]["returning"]] == [3]
    assert back["plan"]["still_failed_over"] == [13]
    told = commands(http, "j", "failback")
    assert [(c["node"], c["ranks"]) for c in told] == [("n0", [3])]
    assert active(http, "j", 13) == "mlx5_4/1"
    assert active(http, "j", 3) == "mlx5_3/1"


def test_case03_a_one_rail_communicator_returns_whole_or_not_at_all(make: Start) -> None:
    """Communicator 77 of ranks 3 and 11, both on rail 3: n0/mlx5_3 and n1/mlx5_3 fail,
    n0/mlx5_3 returns. A fail-back is one switch point for the whole communicator, and no
    channel can keep rail 3 out of it, so it would send rank 11 back to its dead primary:
    nobody of it returns, and no FAILBACK is sent, until rank 11's primary is back."""
    http, clock = make()
    register_nodes(http, ["n0", "n1"])
    post_job(http, "j", ["n0", "n1"], comm={"comm_id": 77, "channels": 4, "ranks": [3, 11]})
    post(http, ev("n0", "port_down", T0), ev("n1", "port_down", T0))
    assert decisions(http, "j")[0]["action"] == "failover"
    clock.advance(10)
    post(http, ev("n0", "port_up", T0 + timedelta(seconds=10)))
    clock.advance(61)
    wait_for("n0's fault to close", lambda: len(faults(http)) == 1)
    assert commands(http, "j", "failback") == []
    assert [d["action"] for d in decisions(http, "j")] == ["failover"]
    assert (active(http, "j", 3), active(http, "j", 11)) == ("mlx5_2/1", "mlx5_2/1")
    post(http, ev("n1", "port_up", T0 + timedelta(seconds=71)))
    clock.advance(61)
    wait_for("the fail-back", lambda: decisions(http, "j")[0]["action"] == "failback")
    assert [r["rank"] for r in decisions(http, "j")[0]["plan"]["returning"]] == [3, 11]
    told = commands(http, "j", "failback")
    assert sorted(r for c in told for r in c["ranks"]) == [3, 11]
    assert len({(c["epoch"], c["ops_done"]) for c in told}) == 1
    assert (active(http, "j", 3), active(http, "j", 11)) == ("mlx5_3/1", "mlx5_3/1")


def test_case04_a_refailure_supersedes_the_pending_failback(make: Start) -> None:
    """n0/mlx5_3 fails, comes back, the damping passes and a FAILBACK to rank 3 is issued
    and delivered. Before its op count the port fails again: the FAILOVER that follows
    must withdraw the FAILBACK. The job registered no communicator, so the failover is a
    FAILOVER alone, with no switch point that would supersede it."""
    http, clock = make()
    register_nodes(http, ["n0", "n1"])
    post_job(http, "j", ["n0", "n1"])
    post(http, ev("n0", "port_down", T0))
    clock.advance(10)
    post(http, ev("n0", "port_up", T0 + timedelta(seconds=10)))
    clock.advance(61)
    wait_for("the fail-back", lambda: decisions(http, "j")[0]["action"] == "failback")
    pending = commands(http, "j", "failback", live=True)
    assert [(c["node"], c["ranks"]) for c in pending] == [("n0", [3])]  # case 3: rank 3 only
    assert any(c["kind"] == "failback" for c in poll(http, "n0"))  # delivered, not applied
    clock.advance(1)
    post(http, ev("n0", "port_down", T0 + timedelta(seconds=72)))
    assert decisions(http, "j")[0]["action"] == "failover"
    assert commands(http, "j", "failback", live=True) == []
    by_id = {c["command_id"]: c for c in commands(http, "j")}
    assert {by_id[c["command_id"]]["state"] for c in pending} == {"superseded"}
    newest_for_3 = [c for c in commands(http, "j", live=True) if 3 in c["ranks"]]
    assert newest_for_3, "rank 3 is told to move to its backup again"
    assert all(c["kind"] != "failback" for c in newest_for_3)
    assert active(http, "j", 3) == "mlx5_2/1"


def test_case04_a_failover_elsewhere_keeps_the_pending_return(make: Start) -> None:
    """The communicator's fail-back of rank 3 is on its way (its switch point names all 16
    ranks; it returns rank 3 alone) when mlx5_1 fails on n0, then on n1. Each failover
    overtakes the fail-back; what replaces it still returns rank 3, moves ranks 1 and 9,
    and keeps rail 1's channels off: nobody else is taken for returning, and nothing
    is issued again once the evidence stops changing."""
    http, clock = make()
    register_nodes(http, ["n0", "n1"])
    post_job(http, "j", ["n0", "n1"], comm=COMM)
    post(http, ev("n0", "port_down", T0))
    for c in commands(http, "j", live=True):
        ack(http, c, "applied")  # rank 3 is on its backup
    clock.advance(10)
    post(http, ev("n0", "port_up", T0 + timedelta(seconds=10)))
    clock.advance(61)
    wait_for("the fail-back", lambda: decisions(http, "j")[0]["action"] == "failback")
    (first,) = {c["epoch"] for c in commands(http, "j", "failback", live=True)}
    for at, node in ((72, "n0"), (73, "n1")):
        clock.advance(1)
        post(http, ev(node, "port_down", T0 + timedelta(seconds=at), device="mlx5_1"))
    settle(http)
    issued = len(commands(http, "j"))
    live = commands(http, "j", live=True)
    assert sorted((c["node"], c["ranks"]) for c in live if c["kind"] == "failover") == [
        ("n0", [1]),
        ("n1", [9]),
    ]
    backs = [c for c in live if c["kind"] == "failback"]
    assert sorted(c["node"] for c in backs) == ["n0", "n1"]
    assert {c["epoch"] for c in backs} != {first}  # the first was overtaken
    assert all(c["returning"] == [3] for c in backs)
    # 16 channels on 8 rails: rail 1 carries channels 1 and 9.
    assert all(c["disabled_channels"] == [1, 9] for c in backs)
    assert active(http, "j", 1) == "mlx5_0/1"
    assert active(http, "j", 9) == "mlx5_0/1"
    clock.advance(1)
    settle(http)
    assert len(commands(http, "j")) == issued


def test_case05_an_inferred_switch_failure_clears_damped_once_its_evidence_is_gone(
    make: Start,
) -> None:
    """n0, n1 and n2 report mlx5_3 down within the correlation window: rail3-leaf failed,
    and n3's rank 27 (on mlx5_3 too, never reported) moves with the others. n0's port
    comes back first: n1 and n2 are still down, so the switch still counts as failed and
    rank 27 stays on its backup. Once all three are up, the switch clears after the
    damping, with them."""
    http, clock = make()
    nodes = ["n0", "n1", "n2", "n3"]
    register_nodes(http, nodes)
    post_job(http, "j", nodes, comm=COMM)
    post(http, *(ev(n, "port_down", T0) for n in nodes[:3]))
    first = decisions(http, "j")[-1]
    assert first["action"] == "failover"
    assert {m["rank"] for m in first["plan"]["failed_over"]} == {3, 11, 19, 27}
    clock.advance(5)
    post(http, ev("n0", "port_up", T0 + timedelta(seconds=5)))
    settle(http)
    assert commands(http, "j", "failback") == []
    assert active(http, "j", 27) == "mlx5_2/1"
    assert [d["action"] for d in decisions(http, "j")] == ["failover"]
    clock.advance(5)
    post(http, *(ev(n, "port_up", T0 + timedelta(seconds=10)) for n in nodes[1:3]))
    clock.advance(30)  # within the damping of the last port up
    settle(http)
    assert active(http, "j", 27) == "mlx5_2/1"
    assert commands(http, "j", "failback") == []
    clock.advance(31)
    wait_for("the fail-back", lambda: job(http, "j")["mode"] == "normal")
    backs = [d for d in decisions(http, "j") if d["action"] == "failback"]
    # Rank 27 returns with the last of the nodes whose ports made the switch failure.
    assert 27 in {r["rank"] for r in backs[0]["plan"]["returning"]}
    assert {r["rank"] for d in backs for r in d["plan"]["returning"]} == {3, 11, 19, 27}


# --- restarts that do not end ---------------------------------------------------------------


def checkpoint(http: httpx.Client, job_id: str, at: datetime, **extra: Any) -> dict[str, Any]:
    r = http.post(f"/v1/jobs/{job_id}/checkpoints", json={"at": at.isoformat(), **extra})
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def restarted_at_a_checkpoint(http: httpx.Client, clock: ManualClock) -> datetime:
    """n0/mlx5_3 fails under job j (n0, n1; communicator 77); a minute later a checkpoint,
    with a spare to restart on and a day's repair ahead, restarts it. When it was taken."""
    register_nodes(http, ["n0", "n1"])
    post_job(http, "j", ["n0", "n1"], comm=COMM)
    post(http, ev("n0", "port_down", T0))
    at = clock.advance(60)
    checkpoint(http, "j", at)
    assert [d["action"] for d in decisions(http, "j")] == ["restart", "failover"]
    return at


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


# --- commands that reach the wrong job ------------------------------------------------------


def half_node_job(job_id: str, gpus: range, **kw: Any) -> dict[str, Any]:
    """Ranks 0-7 on `gpus` of n0, then of n1; no communicator."""
    body = job_body(
        job_id, ["n0"], last_checkpoint_at=(T0 - timedelta(seconds=3000)).isoformat(), **kw
    )
    body["ranks"] = [
        {"rank": i * len(gpus) + k, "node": n, "gpu": g}
        for i, n in enumerate(["n0", "n1"])
        for k, g in enumerate(gpus)
    ]
    return body


def test_case10_commands_name_their_job_and_a_second_job_cannot_take_held_gpus(
    make: Start,
) -> None:
    """Jobs A (GPUs 0-3 of n0 and n1) and B (GPUs 4-7), neither registering a
    communicator: both have ranks 0-7, so comm 0 and a rank number name a process of each.
    A fails over and then restarts: every command n0's agent is handed names job A and its
    incarnation, B gets none. A job posted on GPUs that B (running) holds is refused with
    409 naming B, unless it says it replaces B."""
    http, clock = make()
    register_nodes(http, ["n0", "n1"])
    for body in (half_node_job("A", range(4)), half_node_job("B", range(4, 8))):
        r = http.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
    post(http, ev("n0", "port_down", T0, device="mlx5_1"))  # A's rank 1 (GPU 1)
    assert decisions(http, "A")[0]["action"] == "failover"
    assert decisions(http, "B") == [] and commands(http, "B") == []
    handed = poll(http, "n0")
    assert [(c["kind"], c["ranks"]) for c in handed] == [("failover", [1])]
    at = clock.advance(60)
    checkpoint(http, "A", at)  # restart at it: repair is a day away
    assert decisions(http, "A")[0]["action"] == "restart"
    handed += poll(http, "n0")
    assert [c["kind"] for c in handed] == ["failover", "abort"]
    assert commands(http, "B") == []
    assert [(c["job_id"], c.get("incarnation")) for c in handed] == [("A", 1), ("A", 1)]
    assert {c["incarnation"] for c in commands(http, "A")} == {1}
    taken = http.post("/v1/jobs", json=half_node_job("C", range(4, 8)))
    assert taken.status_code == 409, taken.text
    assert "'B'" in taken.json()["detail"]
    one_gpu = half_node_job("D", range(7, 8))
    assert http.post("/v1/jobs", json=one_gpu).status_code == 409
    instead = http.post("/v1/jobs", json=half_node_job("C", range(4, 8), replaces="B"))
    assert instead.status_code == 201, instead.text


# --- noise -------------------------------------------------------------------------------------


def iterations(http: httpx.Client, job_id: str, seconds: float, n: int) -> dict[str, Any]:
    r = http.post(f"/v1/jobs/{job_id}/iterations", json={"iteration_time_s": [seconds] * n})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_case11_a_drifting_measured_k_re_decides_only_when_the_answer_changes(
    make: Start,
) -> None:
    """Healthy iterations take 1 s. The job fails over, then reports degraded iteration
    times that drift 3 % per report, from 1.20 s to 1.39 s: every k from 1.2 to 1.4 keeps
    failover the cheaper action (50 min into an hour) and the plan the same, so at most the
    first measured k is worth a decision."""
    http, clock = make()
    register_nodes(http, ["n0", "n1"])
    post_job(http, "j", ["n0", "n1"], comm=COMM)
    iterations(http, "j", 1.0, 50)
    post(http, ev("n0", "port_down", T0))
    assert [d["action"] for d in decisions(http, "j")] == ["failover"]
    k = 1.20
    for _ in range(6):
        clock.advance(10)
        out = iterations(http, "j", k, 50)  # the newest 50 are the median's window
        assert out["trustworthy"] and out["measured_k"] == pytest.approx(k)
        k *= 1.03
    history = decisions(http, "j")
    assert {d["action"] for d in history} == {"failover"}
    by_k = [d for d in history if d["trigger"].startswith("measured_k:")]
    assert len(by_k) <= 1, [d["trigger"] for d in by_k]
    assert job(http, "j")["mode"] == "failed_over"


# --- epochs ------------------------------------------------------------------------------------


def switch_points(cmds: list[dict[str, Any]]) -> dict[tuple[int, int], set[tuple[Any, ...]]]:
    """(comm, epoch) -> the plans its switch-point commands carry."""
    out: dict[tuple[int, int], set[tuple[Any, ...]]] = {}
    for c in cmds:
        if c["kind"] in ("rebalance", "failback", "balance"):
            plan = (c["kind"], c["ops_done"], tuple(c["disabled_channels"]))
            out.setdefault((c["comm_id"], c["epoch"]), set()).add(plan)
    return out


def test_case12_epochs_continue_across_incarnations(make: Start) -> None:
    """Incarnation 1 (communicator 77 of 16 channels) fails over with a switch point under
    epoch 1, and restarts at its next checkpoint. Incarnation 2 is posted on the same nodes
    with communicator 77 of 8 channels and starts on its backups with a new channel plan:
    under a later epoch, so that (77, epoch) still names one plan."""
    http, clock = make()
    at = restarted_at_a_checkpoint(http, clock)
    first = commands(http, "j")
    before = max(e for (_, e) in switch_points(first))
    clock.advance(30)
    post_job(http, "j", ["n0", "n1"], comm={"comm_id": 77, "channels": 8}, last_checkpoint_at=at)
    cmds = commands(http, "j")
    later = cmds[len(first) :]
    assert switch_points(later), later  # the new incarnation's channel plan
    assert min(e for (_, e) in switch_points(later)) > before
    assert all(len(plans) == 1 for plans in switch_points(cmds).values()), switch_points(cmds)
    assert {c["incarnation"] for c in later} == {2}
