"""What the model-based test of issue 28 found (sequences_machine.py), each minimised to a
short sequence over the HTTP API, on a manual clock, on SQLite and PostgreSQL.

Each was written failing, as a strict xfail, before its fix landed.
Two nodes of 8 GPUs (hgx_node): rank r is GPU r % 8 of node n(r // 8) unless said
otherwise; GPU g's primary is mlx5_g, its backup the other RNIC behind its PCIe switch
(GPU 3: mlx5_2, GPU 6: mlx5_7).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest

from tests.scheduler_svc.helpers import job_body, register_nodes
from tests.scheduler_svc.sequences import (
    T0,
    Start,
    ack,
    commands,
    decisions,
    ev,
    faults,
    job,
    paths,
    post,
    settle,
    wait_for,
)
from tests.scheduler_svc.sequences_machine import SequencesMachine, connect_to


def post_job(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


@pytest.mark.parametrize("start", ["repost_on_a_spare", "checkpoint_of_the_next_incarnation"])
def test_a_new_incarnation_restarted_at_once_is_sent_its_aborts(make: Start, start: str) -> None:
    """Early in the interval (100 s after a checkpoint) n0/mlx5_3 fails: the job restarts,
    ABORT to n0 and n1. It starts again 10 s after its checkpoint, still early:

    repost_on_a_spare: the fleet manager places it on n2 (for n0) and n1, but n2's mlx5_3
    is down too, so incarnation 2 restarts at once, for evidence of its own placement;
    checkpoint_of_the_next_incarnation: the restarted processes on n0 and n1 checkpoint
    naming incarnation 2 while n0/mlx5_3 is down with n0/mlx5_2 erroring, so GPU 3 has
    no path and incarnation 2 cannot run.

    Either way the job is `restarting` with a restart decision for incarnation 2, so
    incarnation 2's processes must be told: an ABORT of incarnation 2 to each of its
    nodes. The service sends none."""
    http, clock = make()
    register_nodes(http, ["n0", "n1", "n2"])
    at = T0 - timedelta(seconds=100)
    post_job(http, job_body("j", ["n0", "n1"], last_checkpoint_at=at.isoformat()))
    if start == "repost_on_a_spare":
        post(http, ev("n2", "port_down", T0))
    post(http, ev("n0", "port_down", T0))
    assert job(http, "j")["mode"] == "restarting"
    clock.advance(10)
    if start == "repost_on_a_spare":
        nodes = ["n2", "n1"]
        again = job_body("j", nodes, last_checkpoint_at=T0.isoformat())
        assert post_job(http, again)["incarnation"] == 2
    else:
        nodes = ["n0", "n1"]
        post(http, ev("n0", "cqe_error", T0 + timedelta(seconds=5), device="mlx5_2", wc_status=12))
        r = http.post("/v1/jobs/j/checkpoints", json={"at": clock().isoformat(), "incarnation": 2})
        assert r.status_code == 201, r.text
    assert job(http, "j")["incarnation"] == 2
    assert job(http, "j")["mode"] == "restarting"
    assert decisions(http, "j")[0]["action"] == "restart"
    told = {c["node"] for c in commands(http, "j", "abort") if c["incarnation"] == 2}
    assert told == set(nodes), commands(http, "j")


def test_a_refused_balance_falls_back_to_the_dcr_plan_without_a_restart(make: Start) -> None:
    """Job j (GPUs 0-5 of n0 and n1, communicator 77 of 16 channels) and job k (GPUs 6-7,
    no communicator). n0/mlx5_3 fails: j's rank 3 fails over, and the communicator is sent
    a BALANCE switch point (channel weights). n1's plugin refuses it (acked failed). Like a
    refused NVL transit or fail-back (issue 28, case 9), that is an optional mitigation:
    j runs the DCR plan (a REBALANCE with the same channels off) instead, nothing is
    unreachable, nothing restarts, and job k, which never had a command, keeps its paths
    on n1."""
    http, _ = make()
    register_nodes(http, ["n0", "n1"])
    at = (T0 - timedelta(seconds=3000)).isoformat()
    j = job_body(
        "j", ["n0", "n1"], last_checkpoint_at=at, communicators=[{"comm_id": 77, "channels": 16}]
    )
    j["ranks"] = [
        {"rank": i * 6 + g, "node": n, "gpu": g}
        for i, n in enumerate(["n0", "n1"])
        for g in range(6)
    ]
    k = job_body("k", ["n0", "n1"], last_checkpoint_at=at)
    k["ranks"] = [
        {"rank": i * 2 + g - 6, "node": n, "gpu": g}
        for i, n in enumerate(["n0", "n1"])
        for g in (6, 7)
    ]
    post_job(http, j)
    post_job(http, k)
    post(http, ev("n0", "port_down", T0))
    (balance,) = [c for c in commands(http, "j", "balance") if c["node"] == "n1"]
    ack(http, balance, "failed", detail="the plugin refuses channel weights")
    latest, first = decisions(http, "j")
    assert (first["action"], latest["action"]) == ("failover", "failover")
    assert latest["trigger"] == "refused:balance:77"
    # The DCR plan instead, on both nodes, with the channels the BALANCE had off.
    rebalance = commands(http, "j", "rebalance", live=True)
    assert sorted(c["node"] for c in rebalance) == ["n0", "n1"]
    assert {tuple(c["disabled_channels"]) for c in rebalance} == {
        tuple(balance["disabled_channels"])
    }
    assert commands(http, "j", "balance", live=True) == []
    assert [f for f in faults(http) if f["kind"] == "unreachable"] == []
    assert job(http, "j")["mode"] == "failed_over"
    assert paths(http, "j")["failed_over_ranks"] == [3]
    assert all(r["active"] is not None for r in paths(http, "k")["ranks"])


def test_an_unanswered_failover_is_not_left_to_outlive_its_failback(make: Start) -> None:
    """No registered communicator; n0's agent answers nothing, so each command is re-issued
    once its 30 s deadline passes. A CQE error on n0/mlx5_2 moves rank 2 to mlx5_3. Half
    an hour later the CQE fault is quiet and rank 2 is sent its FAILBACK; then a CQE error
    on n0/mlx5_3 moves rank 3 to mlx5_2, and half an hour later rank 3 fails back too.

    The service shows every rank on its primary. Then what is on its way to n0 must take
    every rank there: if rank 2's FAILOVER is still being re-issued, so must be its
    FAILBACK, after it. The service supersedes rank 2's FAILBACK with rank 3's (as if one
    switch point replaced another) and goes on re-issuing rank 2's FAILOVER."""
    http, clock = make(command_ack_timeout_s=30)
    register_nodes(http, ["n0", "n1"])
    at = (T0 - timedelta(seconds=3000)).isoformat()
    post_job(http, job_body("j", ["n0", "n1"], last_checkpoint_at=at))
    post(http, ev("n0", "cqe_error", T0, device="mlx5_2", wc_status=12))
    clock.advance(1800)
    wait_for("rank 2's fail-back", lambda: commands(http, "j", "failback", live=True))
    post(http, ev("n0", "cqe_error", clock(), device="mlx5_3", wc_status=12))
    clock.advance(1800)
    wait_for("rank 3's fail-back", lambda: job(http, "j")["mode"] == "normal")
    settle(http)
    assert paths(http, "j")["failed_over_ranks"] == []
    live = sorted(
        (c for c in commands(http, "j", live=True)),
        key=lambda c: (c["epoch"], c["command_id"]),
    )
    last = {r: c["kind"] for c in live for r in c["ranks"]}
    assert all(kind != "failover" for kind in last.values()), [
        (c["command_id"], c["kind"], c["epoch"], c["ranks"], c["state"])
        for c in commands(http, "j")
    ]


# --- found by the long profile (benchmarks/bench_sequences_model.py), replayed step by step
# through the machine itself, its invariants checked after each step as there.


class Drawn:
    """Stands in for a rule's `data` argument: hands out the values hypothesis drew."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, _strategy: object) -> Any:
        return self.values.pop(0)


def replay(db_url: str, *steps: Callable[[SequencesMachine], object]) -> None:
    class OnThisStore(SequencesMachine):
        connect = staticmethod(connect_to(db_url))

    state = OnThisStore()
    try:
        for step in steps:
            step(state)
            state.check()
    finally:
        state.teardown()


def test_a_failback_withdraws_the_failover_still_on_its_way(db_url: str) -> None:
    """No communicator. A window on n0/mlx5_2 opens now and moves rank 2 to mlx5_3 (its
    FAILOVER unanswered); the window is cancelled; then rail3-leaf fails on n0, n1 and
    n2. Rank 2's backup is dead and its primary fine: it is told to return, and the
    FAILOVER onto mlx5_3 still on its way is withdrawn (invariant 1)."""
    replay(
        db_url,
        lambda s: s.start(with_comm=False, elapsed_s=3000),
        lambda s: s.maintenance(device="mlx5_2", duration_s=60, node="n0", start_s=0, switch=False),
        lambda s: s.cancel_maintenance(data=Drawn(1)),
        lambda s: s.leaf_fails(device="mlx5_3", n=3, nodes=["n0", "n1", "n2", "n3"]),
    )


def test_every_evidence_known_at_a_restart_is_restarted_for_once(db_url: str) -> None:
    """Early in the interval with a communicator: a window on n0/mlx5_2, CQE errors on
    n0/mlx5_2, rail3-leaf failing: GPU 2 has no path, the job restarts. The checkpoint of
    the next incarnation, on the same nodes and the same evidence, does not restart it
    again (invariant 4): everything known at the restart was restarted for, not only what
    touched the job's paths then."""
    replay(
        db_url,
        lambda s: s.start(with_comm=True, elapsed_s=100),
        lambda s: s.checkpoint_current(kind="full", named=False),
        lambda s: s.maintenance(device="mlx5_2", duration_s=60, node="n0", start_s=0, switch=False),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.agent_polls(node="n0"),
        lambda s: s.port_report(device="mlx5_2", node="n0", offset_s=-1, up=False),
        lambda s: s.cqe_burst(device="mlx5_2", n=1, node="n0"),
        lambda s: s.leaf_fails(device="mlx5_3", n=3, nodes=["n0", "n1", "n2", "n3"]),
        lambda s: s.checkpoint_of_the_next_incarnation(),
    )


def test_placed_back_where_no_rank_can_move_the_job_is_normal_and_not_restarted(
    db_url: str,
) -> None:
    """No communicator, early in the interval: CQE errors on n0/mlx5_2, then on mlx5_3,
    leave GPU 2 no path: restart. The next incarnation starts on the same nodes: nobody
    can move to a backup, so it is not `failed_over` (invariant 6) and not restarted
    again; one decision says it runs as placed."""
    replay(
        db_url,
        lambda s: s.start(with_comm=False, elapsed_s=100),
        lambda s: s.checkpoint_current(kind="full", named=False),
        lambda s: s.maintenance(device="mlx5_2", duration_s=60, node="n0", start_s=0, switch=False),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.cqe_burst(device="mlx5_2", n=1, node="n0"),
        lambda s: s.cqe_burst(device="mlx5_3", n=1, node="n0"),
        lambda s: s.checkpoint_of_the_next_incarnation(),
    )


def test_a_rank_stuck_on_what_the_job_was_restarted_for_restarts_it_no_more(db_url: str) -> None:
    """Early in the interval, rail2-leaf fails: restart. Back on n0 and n1, the job runs
    failed over; then rail3-leaf fails, n0 first: restart again (news to it). Placed back
    on n0 and n1 once more, n0's ranks 2 and 3 have no path for what that restart was
    for, whatever n1's later report adds: a restart cannot help there (invariant 4)."""
    nodes = ["n0", "n1", "n2", "n3"]
    replay(
        db_url,
        lambda s: s.start(with_comm=False, elapsed_s=100),
        lambda s: s.leaf_fails(device="mlx5_2", n=3, nodes=nodes),
        lambda s: s.leaf_fails(device="mlx5_2", n=3, nodes=nodes),
        lambda s: s.second_job(with_comm=False),
        lambda s: s.fleet_restarts(nodes=("n0", "n1")),
        lambda s: s.leaf_fails(device="mlx5_3", n=3, nodes=nodes),
        lambda s: s.fleet_restarts(nodes=("n0", "n1")),
    )


def test_pairs_broken_by_what_the_job_was_restarted_for_restart_it_no_more(db_url: str) -> None:
    """A communicator, early in the interval: CQE errors on n0/mlx5_2 restart the job;
    its next incarnation, on the same nodes, runs failed over. CQE errors on n1/mlx5_3
    then leave rank pairs across n0 and n1 on different rails, with no path between them
    (no rank lost both RNICs): restart again, news to it. The third incarnation on the
    same nodes, on nothing new, is not restarted once more (invariant 4)."""
    replay(
        db_url,
        lambda s: s.start(with_comm=True, elapsed_s=100),
        lambda s: s.port_report(device="mlx5_2", node="n0", offset_s=0, up=True),
        lambda s: s.cqe_burst(device="mlx5_2", n=2, node="n0"),
        lambda s: s.checkpoint_of_the_next_incarnation(),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.cqe_burst(device="mlx5_3", n=1, node="n1"),
        lambda s: s.checkpoint_of_the_next_incarnation(),
        lambda s: s.wait_for_the_sweeps(),
    )


def test_what_breaks_while_the_job_restarts_is_restarted_for_too(db_url: str) -> None:
    """Early in the interval, no communicator, with job B beside A: CQE errors on
    n0/mlx5_2 restart A; its next incarnation runs failed over (rank 2 on mlx5_3). Then
    rail3-leaf fails, n1 first: rank pairs across n0 and n1 lose their common rail, and A
    restarts again. While it waits for the fleet manager, n0 and n3 report too (rank 2
    has no RNIC left, and the leaf is inferred failed). The incarnation placed back on n0
    and n1 was placed there knowing that: it is not restarted once more (invariant 4)."""
    replay(
        db_url,
        lambda s: s.start(with_comm=False, elapsed_s=100),
        lambda s: s.second_job(with_comm=False),
        lambda s: s.cqe_burst(device="mlx5_2", n=1, node="n0"),
        lambda s: s.checkpoint_of_the_next_incarnation(),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.agent_polls(node="n0"),
        lambda s: s.leaf_fails(device="mlx5_3", n=3, nodes=["n1", "n0", "n3", "n2"]),
        lambda s: s.checkpoint_of_the_next_incarnation(),
    )


def test_a_refused_failback_holds_no_rank_whose_failover_it_withdrew(db_url: str) -> None:
    """Job B (communicator 78) on GPUs 6-7 of n0 and n1. A window on n0/mlx5_6 moves B's
    rank 0 to mlx5_7, but n0's agent is silent: the FAILOVER is re-issued, never handed
    over. Half an hour later the window is long over and B is told to fail back, which
    withdraws the FAILOVER still on its way: rank 0 never left its primary. n0's agent
    then refuses the FAILBACK. The service must not say rank 0 stays on its backup
    (/paths against the commands, invariant 6): it never got there."""
    replay(
        db_url,
        lambda s: s.start(with_comm=True, elapsed_s=3000),
        lambda s: s.second_job(with_comm=True),
        lambda s: s.maintenance(
            device="mlx5_6", duration_s=60, node="n0", start_s=30, switch=False
        ),
        lambda s: s.advance(seconds=1800),
        lambda s: s.cancel_maintenance(data=Drawn(1)),
        lambda s: s.agent_polls(node="n0"),
        lambda s: s.agent_acks(data=Drawn(0), status="failed"),
    )


def test_a_window_announced_at_a_restart_is_restarted_for(db_url: str) -> None:
    """With a communicator: CQE errors on n0/mlx5_3 move rank 3 to mlx5_2. Windows are
    announced on n0/mlx5_2 (in two minutes) and on rail2-leaf (in 30 s): the leaf's lead
    time begins at once, rank 3 has no path, and A restarts. Its next incarnation, back
    on n0 and n1, runs failed over; when n0/mlx5_2's window starts moving jobs a minute
    later, that is no news: it was announced when the restart was decided, and the
    fleet manager placed the job there knowing it (invariant 4)."""
    replay(
        db_url,
        lambda s: s.start(with_comm=True, elapsed_s=3000),
        lambda s: s.cqe_burst(device="mlx5_3", n=1, node="n0"),
        lambda s: s.maintenance(
            device="mlx5_2", duration_s=600, node="n0", start_s=120, switch=False
        ),
        lambda s: s.maintenance(device="mlx5_2", duration_s=60, node="n1", start_s=30, switch=True),
        lambda s: s.checkpoint_of_the_next_incarnation(),
        lambda s: s.advance(seconds=61),
    )


def test_what_a_restart_was_for_is_no_news_on_any_placement(db_url: str) -> None:
    """Early in the interval, no communicator: CQE errors on n1/mlx5_2 restart A. The fleet
    manager places it on n0 and n3, where n3/mlx5_2 erred too: restart again (news to that
    placement). Placed back on n0 and n1, the job meets n1's fault once more, which its
    first restart was for: it runs failed over, not restarted a third time (invariant 4)."""
    replay(
        db_url,
        lambda s: s.start(with_comm=False, elapsed_s=100),
        lambda s: s.advance(seconds=1),
        lambda s: s.cqe_burst(device="mlx5_2", n=3, node="n3"),
        lambda s: s.cqe_burst(device="mlx5_2", n=1, node="n1"),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.fleet_restarts(nodes=("n0", "n3")),
        lambda s: s.fleet_restarts(nodes=("n0", "n1")),
    )


def test_an_overtaken_failback_restores_no_failover_it_withdrew(db_url: str) -> None:
    """Job B (communicator 78) beside A. CQE errors on n0/mlx5_6 move B's rank 0 to mlx5_7;
    n0's agent does not poll, so its FAILOVER is never handed over. Five minutes on, B is
    told to fail back, which withdraws that FAILOVER on its way; then mlx5_6 errs again
    and a failover overtakes the fail-back. Rank 0 never left its primary: the new
    failover must send it a FAILOVER, not take it as already on its backup and send the
    channel plan alone (/paths against the commands, invariant 6)."""
    replay(
        db_url,
        lambda s: s.start(with_comm=False, elapsed_s=100),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.maintenance(device="mlx5_2", duration_s=600, node="n0", start_s=0, switch=True),
        lambda s: s.advance(seconds=1),
        lambda s: s.partition(node="n2"),
        lambda s: s.partition_heals(data=Drawn("n2")),
        lambda s: s.cancel_maintenance(data=Drawn(1)),
        lambda s: s.leaf_fails(device="mlx5_5", n=4, nodes=["n1", "n2", "n0", "n3"]),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.second_job(with_comm=True),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.fleet_restarts(nodes=("n0", "n1")),
        lambda s: s.checkpoint_current(kind="full", named=False),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.partition(node="n2"),
        lambda s: s.checkpoint_current(kind="flowcheck", named=False),
        lambda s: s.advance(seconds=5),
        lambda s: s.partition_heals(data=Drawn("n2")),
        lambda s: s.checkpoint_current(kind="flowcheck", named=True),
        lambda s: s.checkpoint_current(kind="flowcheck", named=True),
        lambda s: s.cqe_burst(device="mlx5_6", n=4, node="n0"),
        lambda s: s.partition(node="n1"),
        lambda s: s.partition_heals(data=Drawn("n1")),
        lambda s: s.advance(seconds=301),
        lambda s: s.cqe_burst(device="mlx5_6", n=1, node="n0"),
    )


def test_a_node_unreachable_for_one_job_is_evidence_for_every_job_on_it(db_url: str) -> None:
    """n0's agent is cut off. Job B's FAILOVER to n0 goes unanswered three times, so n0 is
    unreachable: evidence on the node, which leaves job A's ranks there without a path
    too. A must be reconciled with it (it restarts), not keep showing failed_over with
    nobody on a backup in /paths (invariant 6). The open finding (a) of the last long
    profile was this."""
    replay(
        db_url,
        lambda s: s.start(with_comm=False, elapsed_s=100),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.maintenance(device="mlx5_2", duration_s=600, node="n0", start_s=0, switch=True),
        lambda s: s.advance(seconds=1),
        lambda s: s.partition(node="n0"),
        lambda s: s.leaf_fails(device="mlx5_6", n=3, nodes=["n0", "n1", "n3", "n2"]),
        lambda s: s.checkpoint_current(kind="full", named=False),
        lambda s: s.wait_for_the_sweeps(),
        lambda s: s.second_job(with_comm=True),
        lambda s: s.one_comes_back(data=Drawn(("n3", "mlx5_6"))),
        lambda s: s.checkpoint_of_an_ended_incarnation(named=False),
        lambda s: s.cancel_maintenance(data=Drawn(1)),
        lambda s: s.advance(seconds=1800),
        lambda s: s.one_comes_back(data=Drawn(("n1", "mlx5_6"))),
        lambda s: s.checkpoint_of_the_next_incarnation(),
        lambda s: s.leaf_fails(device="mlx5_2", n=4, nodes=["n3", "n1", "n0", "n2"]),
        lambda s: s.leaf_fails(device="mlx5_6", n=4, nodes=["n2", "n0", "n1", "n3"]),
        lambda s: s.advance(seconds=31),
        lambda s: s.checkpoint_of_the_next_incarnation(),
        lambda s: s.advance(seconds=61),
    )


def test_a_failback_beside_members_without_any_path(db_url: str) -> None:
    """Long profile, run 7 on SQLite. Communicator 77. CQE errors on n1's mlx5_3 and
    mlx5_2 leave n1's GPUs 2 and 3 no path: restart. The next incarnation, back on n0 and
    n1, runs on what is left (it is not restarted again for them). rail3-leaf fails (rank
    3 of n0 goes to mlx5_2), n0/mlx5_3 comes back and rank 3 is sent a FAILBACK switch
    point, which names every member and disables no channel; then rail2-leaf fails, n0
    first. That FAILBACK is still live and, read as "every member to its primary", sends
    rank 2 of n0 onto mlx5_2, now down (invariant 1). Holding rank 3 on its backup while
    members of its communicator have no path (tried) keeps it there after its backup
    fails instead. Settled: a rank whose backup fails while its primary is still failed has
    no path to lose and stays where it was told (engine `_stranded`: no fail-back onto its
    dead primary; a FAILOVER on its way moves it from one dead port to the other); /paths
    shows it on its backup with no active path."""
    replay(
        db_url,
        lambda s: s.start(with_comm=True, elapsed_s=3000),
        lambda s: s.cqe_burst(device="mlx5_3", n=4, node="n1"),
        lambda s: s.cqe_burst(device="mlx5_2", n=2, node="n1"),
        lambda s: s.partition(node="n0"),
        lambda s: s.advance(seconds=1),
        lambda s: s.checkpoint_of_the_next_incarnation(),
        lambda s: s.advance(seconds=7),
        lambda s: s.leaf_fails(device="mlx5_3", n=3, nodes=["n3", "n2", "n0", "n1"]),
        lambda s: s.cqe_burst(device="mlx5_2", n=4, node="n2"),
        lambda s: s.one_comes_back(data=Drawn(("n0", "mlx5_3"))),
        lambda s: s.cqe_burst(device="mlx5_2", n=1, node="n3"),
        lambda s: s.agent_polls(node="n0"),
        lambda s: s.partition(node="n0"),
        lambda s: s.leaf_fails(device="mlx5_2", n=3, nodes=["n0", "n2", "n1", "n3"]),
    )


def test_a_failback_beside_members_without_any_path_short(db_url: str) -> None:
    """Long profile, run 8 on PostgreSQL: the shortest form of the one above. With
    rail3-leaf down and CQE errors on n0/mlx5_2, n0's GPU 2 has no path: restart. Placed
    back on n0 and n1, the job runs on what is left; when rail2-leaf fails too (n1 does
    not report), the service sends a FAILBACK switch point returning rank 9 that disables
    no channel, which reads as returning rank 2 of n0 onto its dead mlx5_2 (invariant 1).
    Rank 9 is the one returned: its backup n1/mlx5_2 failed with rail2-leaf and its
    primary with rail3-leaf. It now stays where it was told, and nobody is sent a FAILBACK.
    Before the fix for a `none` that left a rank on its backup, the same sequence broke
    invariant 6 instead."""
    replay(
        db_url,
        lambda s: s.start(with_comm=True, elapsed_s=3000),
        lambda s: s.leaf_fails(device="mlx5_3", n=4, nodes=["n0", "n2", "n1", "n3"]),
        lambda s: s.cqe_burst(device="mlx5_2", n=3, node="n0"),
        lambda s: s.checkpoint_of_the_next_incarnation(),
        lambda s: s.leaf_fails(device="mlx5_2", n=3, nodes=["n3", "n0", "n2", "n1"]),
    )


def test_a_failback_with_a_failover_of_two_ranks_beside_members_without_any_path(
    db_url: str,
) -> None:
    """Long profile, run 8 on PostgreSQL. A job placed back on what it was restarted
    for sends one FAILOVER moving ranks 9 and 11 of n1 to mlx5_2 and mlx5_4; rail2-leaf
    then fails and rank 9 is told to return. A fail-back withdrew only a FAILOVER whose
    every rank it returned, so the one still on its way moved rank 9 onto the dead
    mlx5_2 (invariant 1): fixed (test_a_failback_splits_a_failover_of_two_ranks). What
    was left is the finding above: the FAILBACK switch point, disabling no channel, read as
    returning rank 2 of n0 onto its dead mlx5_2; rank 9 now stays where it was told."""
    replay(
        db_url,
        lambda s: s.start(with_comm=True, elapsed_s=3000),
        lambda s: s.leaf_fails(device="mlx5_3", n=4, nodes=["n0", "n2", "n1", "n3"]),
        lambda s: s.cqe_burst(device="mlx5_2", n=3, node="n0"),
        lambda s: s.leaf_fails(device="mlx5_3", n=4, nodes=["n0", "n3", "n2", "n1"]),
        lambda s: s.leaf_fails(device="mlx5_5", n=3, nodes=["n3", "n2", "n1", "n0"]),
        lambda s: s.checkpoint_of_the_next_incarnation(),
        lambda s: s.leaf_fails(device="mlx5_2", n=4, nodes=["n2", "n1", "n3", "n0"]),
    )


def test_a_failback_splits_a_failover_of_two_ranks(make: Start) -> None:
    """No communicator. n0's mlx5_2 and mlx5_4 go down in one report: one FAILOVER moves
    ranks 2 and 4, and n0's agent has not taken it yet. mlx5_2 comes back: rank 2 is told
    to return, and that FAILOVER is withdrawn, since sent after the fail-back it would
    move rank 2 to its backup again; rank 4 still needs it, so it goes again for rank 4
    alone (before, it stayed on its way whole)."""
    http, clock = make()
    register_nodes(http, ["n0", "n1"])
    at = (T0 - timedelta(seconds=3000)).isoformat()
    post_job(http, job_body("j", ["n0", "n1"], last_checkpoint_at=at))
    post(
        http, ev("n0", "port_down", T0, device="mlx5_2"), ev("n0", "port_down", T0, device="mlx5_4")
    )
    (both,) = commands(http, "j", "failover", live=True)
    assert both["ranks"] == [2, 4]
    post(http, ev("n0", "port_up", T0 + timedelta(seconds=5), device="mlx5_2"))
    clock.advance(66)
    wait_for("rank 2's fail-back", lambda: commands(http, "j", "failback", live=True))
    settle(http)
    assert [c["ranks"] for c in commands(http, "j", "failback", live=True)] == [[2]]
    (again,) = commands(http, "j", "failover", live=True)
    assert again["ranks"] == [4] and again["command_id"] > both["command_id"]
    assert again["epoch"] == both["epoch"]
    assert paths(http, "j")["failed_over_ranks"] == [4]


def test_a_failover_overtakes_a_nodes_failback_though_another_node_applied_its_own(
    db_url: str,
) -> None:
    """Long profile, run 9 on SQLite. Job B has no communicator: each rank is told its own
    return. A window on rail6-leaf moves B's ranks 0 (n0) and 2 (n1) to mlx5_7 as B
    registers; the window is cancelled and both are told to return, in one FAILBACK of
    two rows. n1 applies its row, n0 has not polled yet. Then rail6-leaf fails: rank 0
    must go to its backup again, and its FAILBACK still on its way is superseded. It was
    not: an applied row was read as the op count of a switch point having passed for
    every node, so the FAILBACK stayed live and would take rank 0 onto the dead mlx5_6
    (invariant 1)."""
    replay(
        db_url,
        lambda s: s.start(with_comm=True, elapsed_s=100),
        lambda s: s.maintenance(device="mlx5_6", duration_s=60, node="n0", start_s=0, switch=True),
        lambda s: s.second_job(with_comm=False),
        lambda s: s.cancel_maintenance(data=Drawn(1)),
        lambda s: s.partition_heals(data=Drawn("n1")),
        lambda s: s.leaf_fails(device="mlx5_6", n=3, nodes=["n1", "n2", "n0", "n3"]),
    )
