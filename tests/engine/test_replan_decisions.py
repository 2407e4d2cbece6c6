"""A decision without a cost question: a job that starts on its backups, or ranks re-placed."""

from __future__ import annotations

from dataclasses import replace

from scheduler_svc.engine.job_routes import index_for, routes_of
from scheduler_svc.engine.nccl import NcclSpec
from scheduler_svc.engine.paths import plan_node
from scheduler_svc.engine.reconcile import reconcile
from scheduler_svc.engine.state import Action, Desired, Mode
from tests.engine.stories import Story, at, down, topo


def test_a_job_registered_on_open_faults_records_a_replan() -> None:
    s = Story(["n0", "n1"], job_kw={"registering": True})
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    out = s.step(210)
    d = out.decision
    assert d is not None
    assert d.trigger == "replan:2026-11-01T12:03:30+00:00"
    assert d.action == Action.FAILOVER
    assert d.reason == "the job starts on its backups: faults open before it was registered"
    assert d.fault_key is None
    assert (d.costs_s, d.costs_gpu_s, d.saved_gpu_s) == ({}, {}, 0.0)
    assert d.inputs == {
        "t_elapsed_s": 210.0,
        "checkpoint_interval_s": 3600,
        "k": 1.5,
        "k_source": "measured",
        "detect_s": 0,
        "reload_s": 600,
        "timeout_s": 30,
        "threshold_s": 1200.0,
        "gpus": 16,
    }
    assert d.plan["mitigation"] == "balance"
    assert d.plan["failed_over"] == [
        {"rank": 3, "node": "n0", "gpu": 3, "from": "mlx5_3/1", "to": "mlx5_2/1"}
    ]
    assert d.plan["warnings"] == []
    assert [
        (c["comm_id"], c["mitigation"], c["disabled_channels"]) for c in d.plan["communicators"]
    ] == [(77, "balance", [3, 11])]
    assert out.desired.mode == Mode.FAILED_OVER
    assert out.desired.mitigation == {77: "balance"}
    assert out.desired.disabled == {77: (3, 11)}
    assert out.conn is not None and out.conn.failed_over_ranks == (3,)
    assert out.warnings == ()


def test_a_stock_nccl_job_registered_on_open_faults_has_no_channel_plan() -> None:
    spec = NcclSpec((2, 29, 7), port_failover=True, merged_nics=(frozenset({"mlx5_2", "mlx5_3"}),))
    s = Story(["n0", "n1"], job_kw={"registering": True, "nccl": spec, "slowdown_k": None})
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    out = s.step(210)
    d = out.decision
    assert d is not None
    assert d.action == Action.FAILOVER
    assert d.plan["mitigation"] == "s-bond"
    # Nothing known about k: the first default.
    assert (d.inputs["k"], d.inputs["k_source"]) == (1.03, "default")
    assert out.desired.mitigation == {}


def test_ranks_re_placed_onto_a_failed_rnic_follow_it_with_the_k_of_the_failover() -> None:
    """Re-registered with its nodes swapped, rank 3 sits on the failed RNIC and rank 1 does
    not: nothing new failed, so no cost question, and the k decided at the failover (from
    the bandwidth model: the job declares none) still stands."""
    ranks = ((0, "n0", 2), (1, "n0", 3), (2, "n1", 2), (3, "n1", 3))
    s = Story(["n0", "n1"], ranks=ranks, job_kw={"comm_share": 0.4, "slowdown_k": None})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    assert (dict(s.desired.moved), s.desired.k) == ({1: "mlx5_2/1"}, 1.4)
    s.ranks = ((0, "n1", 2), (1, "n1", 3), (2, "n0", 2), (3, "n0", 3))
    out = s.step(3100)
    d = out.decision
    assert d is not None
    assert (d.trigger, d.action) == ("replan:2026-11-01T12:51:40+00:00", Action.FAILOVER)
    assert d.reason == "ranks follow the paths the open faults leave them (nothing new failed)"
    assert (d.inputs["k"], d.inputs["k_source"], d.inputs["gpus"]) == (1.4, "measured", 4)
    assert d.plan["failed_over"] == [
        {"rank": 3, "node": "n0", "gpu": 3, "from": "mlx5_3/1", "to": "mlx5_2/1"}
    ]
    assert dict(out.desired.moved) == {3: "mlx5_2/1"}
    assert out.desired.k == 1.4


def test_the_node_plans_warnings_travel_with_a_replan() -> None:
    s = Story(["n0", "n1"], shape={"switch_name": "leaf"}, job_kw={"registering": True})
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    out = s.step(210)
    assert out.decision is not None and out.decision.trigger.startswith("replan:")
    warned = plan_node(topo("n0", switch_name="leaf")).warnings
    assert out.warnings == warned + plan_node(topo("n1", switch_name="leaf")).warnings
    assert out.decision.plan["warnings"] == list(out.warnings)


def test_communicators_registered_while_failed_over_replan_their_channels() -> None:
    """The same rank stays on the same backup, but the job now has 8 channels instead of
    16: the channel plan changes without new evidence, a replan with no cost question."""
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    assert (dict(s.desired.moved), s.desired.disabled) == ({3: "mlx5_2/1"}, {77: (3, 11)})
    s.comm_channels = 8
    out = s.step(3100)
    d = out.decision
    assert d is not None
    assert (d.trigger, d.action) == ("replan:2026-11-01T12:51:40+00:00", Action.FAILOVER)
    assert d.reason == "ranks follow the paths the open faults leave them (nothing new failed)"
    assert d.fault_key is None
    assert (d.inputs["k"], d.inputs["gpus"]) == (1.5, 16)
    assert d.plan["mitigation"] == "balance"
    assert d.plan["failed_over"] == [
        {"rank": 3, "node": "n0", "gpu": 3, "from": "mlx5_3/1", "to": "mlx5_2/1"}
    ]
    assert [
        (c["comm_id"], c["mitigation"], c["disabled_channels"]) for c in d.plan["communicators"]
    ] == [(77, "balance", [3])]
    assert out.desired.mode == Mode.FAILED_OVER
    assert dict(out.desired.moved) == {3: "mlx5_2/1"}
    assert out.desired.disabled == {77: (3,)}
    assert out.desired.mitigation == {77: "balance"}
    assert out.desired.evidence == frozenset({"fault:1"})
    assert out.desired.k == 1.5


def test_a_pass_with_nothing_to_decide_still_answers_the_paths_and_warnings() -> None:
    """No fault, no decision: the desired state is the default one, and the pass still
    returns the job's connectivity and every node plan's warnings."""
    s = Story(["n0", "n1"], shape={"switch_name": "leaf"})
    now = at(10)
    out = s.step(10)
    assert out.decision is None
    assert out.desired == Desired()
    assert out.conn == routes_of(s.job(), s.fabric(now))
    # One pair per rail: the two nodes' GPUs on it.
    assert (out.conn.total_pairs, out.conn.broken_pairs, out.conn.failed_over_ranks) == (8, 0, ())
    warned = plan_node(topo("n0", switch_name="leaf")).warnings
    assert warned and out.warnings == warned + plan_node(topo("n1", switch_name="leaf")).warnings


def test_an_index_built_on_other_plans_answers_as_the_whole_job_does() -> None:
    """The index fits the job's nodes, but the fabric's plans are another mapping (one
    more node, with warnings of its own). The pass reads the job through the index (and
    hands it on with the connectivity, for command_diff), but the warnings are the
    fabric's, not the index's: the answer is the whole job's."""
    s = Story(["n0", "n1"], shape={"switch_name": "leaf"})
    now = at(10)
    fabric = s.fabric(now)
    index = index_for(s.job(), fabric)
    n2 = topo("n2", switch_name="leaf")
    wider = replace(
        fabric,
        topologies={**fabric.topologies, "n2": n2},
        plans={**fabric.plans, "n2": plan_node(n2)},
    )
    fast = reconcile(now, s.job(), wider, s.options, index)
    assert fast.conn.index is index
    assert fast == reconcile(now, s.job(), wider, s.options)
    assert len(fast.warnings) == 24
    assert fast.warnings[16:] == plan_node(n2).warnings
