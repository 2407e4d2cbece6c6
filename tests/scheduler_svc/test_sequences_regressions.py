"""Issue 28, case by case: each sequence that leads the service wrong, over its HTTP API.

Every test reproduces one case of the issue on a manual clock, on SQLite and PostgreSQL,
and asserts what the service should do (each was written failing, as a strict xfail,
before its fix landed). The restarts that do not end (cases 6 to 9) are in
test_sequences_regressions_restarts.py.

Two nodes of 8 GPUs (hgx_node): rank r is GPU r % 8 of node n(r // 8); GPU g's primary is
mlx5_g on switch rail<g>-leaf, its backup the other RNIC behind its PCIe switch (GPU 3:
mlx5_2, GPU 5: mlx5_4), on another rail.
"""

from __future__ import annotations

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
    port_state,
    post,
    post_job,
    restarted_at_a_checkpoint,
    settle,
    wait_for,
)

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
