"""The cost decision's exact record: inputs, costs, reason, plan and GPU time saved."""

from __future__ import annotations

from dataclasses import replace

from scheduler_svc.engine.fabric import (
    Evidence,
    FaultEvidence,
    FaultKind,
    Maintenance,
    SwitchEvidence,
    assess,
)
from scheduler_svc.engine.nccl import NcclSpec
from scheduler_svc.engine.paths import plan_node
from scheduler_svc.engine.reconcile import reconcile
from scheduler_svc.engine.state import Action, CheckpointSeen, FabricView, Mode, Options
from tests.engine.stories import RULES, SCALED, Story, at, down, topo


def test_a_modelled_k_failover_record() -> None:
    s = Story(["n0", "n1"], job_kw={"comm_share": 0.4, "slowdown_k": None})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.faults[2] = down(2, "n1", "mlx5_3", 3000.5, switch="x")
    d = s.step(3001).decision
    assert d is not None
    assert (d.trigger, d.fault_key, d.action) == ("fault:1", "fault:1", Action.FAILOVER)
    # k = 1 + 0.4 * (1 / 0.5 - 1): 40 % communication at half the bandwidth.
    assert d.inputs == {
        "t_elapsed_s": 3000.0,
        "checkpoint_interval_s": 3600,
        "k": 1.4,
        "k_source": "model",
        "detect_s": 0,
        "reload_s": 600,
        "timeout_s": 30,
        "threshold_s": (3600 * (1.4 - 1) - 0) / 1.4,
        "gpus": 16,
        "concurrent_faults": 2,
        "path_available": True,
        "dp_size": 1,
        "new_dp_size": None,
        "allow_scaling": False,
        "spare_nodes": True,
        "spares_free": None,
        "spare_reserve": 0,
        "node_replace_s": 0.0,
        "spare_price_s": 0.0,
        "planned": False,
    }
    assert d.costs_s == {
        "failover": 1470.0,
        "restart": 4230.0,
        "restart_scaled": None,
        "none": None,
    }
    assert d.costs_gpu_s == {
        "failover": 1470.0 * 16,
        "restart": 4230.0 * 16,
        "restart_scaled": None,
        "none": None,
    }
    assert d.saved_gpu_s == (4230.0 - 1470.0) * 16
    assert d.reason == (
        "fail over: 50.0 min since the last checkpoint is past the 17.1 min threshold at "
        "k=1.4: failing over costs 24.5 min, restart 1.18 h"
    )
    assert d.plan["bandwidth_left"] == 0.5
    assert d.plan["mitigation"] == "balance"
    assert d.plan["k_detail"] == "communication share 40% at 50% of the bandwidth"
    assert d.plan["failed_over"] == [
        {"rank": 3, "node": "n0", "gpu": 3, "from": "mlx5_3/1", "to": "mlx5_2/1"},
        {"rank": 11, "node": "n1", "gpu": 3, "from": "mlx5_3/1", "to": "mlx5_2/1"},
    ]
    assert [c["evidence"] for c in d.plan["failed_components"]] == ["fault:1", "fault:2"]
    assert (d.plan["isolated_ranks"], d.plan["broken_pairs"], d.plan["notes"]) == ([], 0, [])


def test_ranks_without_any_path_restart_and_say_how_many_pairs_broke() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.faults[2] = down(2, "n0", "mlx5_2", 3000.5)
    d = s.step(3001).decision
    assert d is not None
    assert d.action == Action.RESTART
    assert d.reason == (
        "2 rank pair(s) across nodes have no path left (2 rank(s) lost both RNICs): no usable "
        "path is left for some GPU (primary and backup both lost); restart (1.18 h) is the "
        "only way forward"
    )
    assert d.inputs["concurrent_faults"] == 2
    assert d.inputs["path_available"] is False
    assert (d.plan["isolated_ranks"], d.plan["broken_pairs"]) == ([2, 3], 2)
    assert d.plan["example_broken_pairs"][:2] == [[2, 10], [3, 11]]
    assert d.plan["bandwidth_left"] is None
    assert d.plan["k_detail"] == "measured by the job"
    assert d.saved_gpu_s == 0.0


def test_port_faults_on_a_failed_switch_count_as_that_one_failure() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.faults[2] = down(2, "n0", "mlx5_5", 3000.2, switch="rail5-leaf")
    s.faults[3] = down(3, "n1", "mlx5_5", 3000.4, switch="rail5-leaf")
    s.switches[1] = SwitchEvidence(1, "rail5-leaf", at(3000.6), "2 nodes lost their port")
    d = s.step(3001).decision
    assert d is not None
    assert d.trigger == "switch:1"
    assert d.inputs["concurrent_faults"] == 2
    assert (d.inputs["k"], d.inputs["k_source"]) == (1.5, "measured")
    assert d.reason == (
        "switch rail5-leaf inferred failed (2 nodes lost their port); all its links count as "
        "failed: fail over: 50.0 min since the last checkpoint is past the 20.0 min threshold "
        "at k=1.5: failing over costs 25.5 min, restart 1.18 h"
    )
    assert sorted(s.desired.moved) == [3, 5, 13]


def test_stock_nccl_failover_is_nccls_own_plan() -> None:
    spec = NcclSpec((2, 29, 7), port_failover=True, merged_nics=(frozenset({"mlx5_2", "mlx5_3"}),))
    s = Story(["n0", "n1"], job_kw={"nccl": spec})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    out = s.step(3000)
    d = out.decision
    assert d is not None
    assert d.action == Action.FAILOVER
    assert d.reason == (
        "NCCL 2.29.7 with port failover: n0 virtual NIC [mlx5_2, mlx5_3] lost mlx5_3; NCCL "
        "fails over to its healthy partner itself (2 rank(s) run degraded): fail over: 50.0 "
        "min since the last checkpoint is past the 20.0 min threshold at k=1.5: failing over "
        "costs 25.5 min, restart 1.18 h"
    )
    assert d.plan["mitigation"] == "nccl"
    assert d.plan["failed_over"] == []
    assert d.plan["nccl"] == {
        "outcome": "fails_over",
        "degraded_ranks": [2, 3],
        "fatal_ranks": [],
        "bandwidth_left": 0.5,
        "virtual_nics": [
            {
                "node": "n0",
                "members": ["mlx5_2", "mlx5_3"],
                "failed": ["mlx5_3"],
                "outcome": "fails_over",
            }
        ],
    }
    assert out.desired.k == 1.5
    assert out.desired.mitigation == {}
    assert out.desired.moved == {3: "mlx5_2/1"}


def test_a_dead_node_is_named_first() -> None:
    s = Story(["n0", "n1"])
    for i in range(8):
        s.faults[i + 1] = down(i + 1, "n0", f"mlx5_{i}", 3000)
    d = s.step(3000).decision
    assert d is not None
    assert d.action == Action.RESTART
    assert d.reason == (
        "node failure: every fabric RNIC of n0 failed (a dead peer, not the network): 8 rank "
        "pair(s) across nodes have no path left (8 rank(s) lost both RNICs): no usable path is "
        "left for some GPU (primary and backup both lost); restart (1.18 h) is the only way "
        "forward"
    )


def test_a_fault_at_the_checkpoint_has_no_time_elapsed() -> None:
    s = Story(["n0", "n1"])
    s.faults[1] = down(1, "n0", "mlx5_3", 0)
    d = s.step(0).decision
    assert d is not None
    assert d.inputs["t_elapsed_s"] == 0.0


def test_a_restart_after_a_failover_clears_every_plan_and_keeps_its_k() -> None:
    s = Story(["n0", "n1"], job_kw={"slowdown_k": None})
    s.faults[1] = down(1, "n0", "mlx5_3", 1500)
    s.step(1500)
    assert s.desired.mitigation == {77: "balance"}
    s.measured_k = 2.5
    out = s.step(1600)
    assert out.decision is not None and out.decision.action == Action.RESTART
    assert out.desired.mode == Mode.RESTARTING
    assert out.desired.moved == {}
    assert out.desired.disabled == {}
    assert out.desired.mitigation == {}
    assert out.desired.channel_plan() == ({}, {}, {})
    assert out.desired.k == 2.5


def test_without_scaling_allowed_no_new_dp_size_is_recorded() -> None:
    # With scaling allowed this layout restarts at DP 3 (one replica per node).
    layout = {"dp_size": 4, "tp_size": 8, "spare_nodes": False, "node_replace_s": 7200}
    allowed = Story(["n0", "n1", "n2", "n3"], job_kw=layout | {"allow_scaling": True})
    allowed.faults[1] = down(1, "n0", "mlx5_3", 100)
    scaled = allowed.step(100).decision
    assert scaled is not None and scaled.inputs["new_dp_size"] == 3
    s = Story(["n0", "n1", "n2", "n3"], job_kw=layout | {"allow_scaling": False})
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    d = s.step(100).decision
    assert d is not None
    assert (d.inputs["dp_size"], d.inputs["new_dp_size"]) == (4, None)
    assert d.costs_s["restart_scaled"] is None


def test_the_default_k_table_comes_from_the_options() -> None:
    s = Story(["n0", "n1"], job_kw={"slowdown_k": None})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    now = at(3000)
    out = reconcile(now, s.job(), s.fabric(now), Options(default_k=(1.1, 1.2, 1.3)))
    assert out.decision is not None
    assert (out.decision.inputs["k"], out.decision.inputs["k_source"]) == (1.1, "default")


def test_a_scaled_restart_names_the_nodes_and_replicas_it_drops() -> None:
    layout = {"dp_size": 4, "tp_size": 4, "pp_size": 2}
    s = Story(["n0", "n1", "n2", "n3"], job_kw=SCALED | layout)
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    d = s.step(100).decision
    assert d is not None
    assert d.reason == (
        "restart_scaled: only 1.7 min since the last checkpoint, before the 40.0 min "
        "threshold at k=3: restart_scaled costs 2.17 h, failing over 3.09 h; drop n0 (DP "
        "replicas 0, 1): DP 4 -> 2"
    )


def test_a_scaled_restart_that_drops_two_nodes_names_both() -> None:
    s = Story(["n0", "n1", "n2", "n3"], job_kw=SCALED | {"dp_size": 4, "tp_size": 8})
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    s.faults[2] = down(2, "n2", "mlx5_5", 100)
    d = s.step(100).decision
    assert d is not None
    assert d.action == Action.RESTART_SCALED
    assert d.reason.endswith("; drop n0, n2 (DP replicas 0, 2): DP 4 -> 2")


def test_planned_maintenance_moves_ahead_of_its_window() -> None:
    s = Story(["n0", "n1"])
    window = Maintenance(
        1, at(3000), at(4000), node="n0", device="mlx5_3", port=1, moves_at=at(2900), reason="fw"
    )
    now = at(2950)
    health = assess(Evidence(maintenance=(window,)), now, RULES)
    nodes = {n: topo(n) for n in s.nodes}
    fabric = FabricView(
        nodes, {n: plan_node(t) for n, t in nodes.items()}, health.failed, health.unhealthy
    )
    d = reconcile(now, s.job(), fabric, Options()).decision
    assert d is not None
    assert (d.trigger, d.action, d.inputs["planned"]) == ("maintenance:1", Action.FAILOVER, True)
    assert d.reason == (
        "n0/mlx5_3/1: planned maintenance 1 (fw) from 2026-11-01T12:50:00+00:00 to "
        "2026-11-01T13:06:40+00:00: fail over ahead of it: every GPU keeps a path, so the "
        "ranks move to their backups before the window opens and nothing restarts"
    )


def test_a_one_rank_job_that_lost_both_rnics_restarts_at_its_one_gpu() -> None:
    """One rank, so no pair across nodes can break: its GPU without any RNIC is the reason."""
    s = Story(["n0"], ranks=((0, "n0", 3),))
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.faults[2] = down(2, "n0", "mlx5_2", 3000)
    d = s.step(3000).decision
    assert d is not None
    assert d.action == Action.RESTART
    assert (d.plan["isolated_ranks"], d.plan["broken_pairs"]) == ([0], 0)
    assert (d.inputs["gpus"], d.inputs["path_available"]) == (1, False)
    assert d.costs_s["none"] is None
    assert d.costs_gpu_s == {
        "failover": None,
        "restart": 4230.0,
        "restart_scaled": None,
        "none": None,
    }
    assert d.reason == (
        "no usable path is left for some GPU (primary and backup both lost); restart "
        "(1.18 h) is the only way forward"
    )
    assert s.desired.mode == Mode.RESTARTING


def test_a_job_registered_on_faults_that_leave_a_gpu_no_path_names_the_state() -> None:
    """Nothing is new to it, so no fault names the decision: the state at that time does."""
    s = Story(["n0", "n1"], job_kw={"registering": True})
    s.faults[1] = down(1, "n0", "mlx5_3", 100)
    s.faults[2] = down(2, "n0", "mlx5_2", 100)
    d = s.step(210).decision
    assert d is not None
    assert (d.trigger, d.fault_key) == ("state:2026-11-01T12:03:30+00:00", None)
    assert d.action == Action.RESTART
    assert d.plan["isolated_ranks"] == [2, 3]


def test_the_node_plans_warnings_travel_with_the_failover() -> None:
    # Every rail on one leaf: each GPU's backup shares its primary's switch.
    s = Story(["n0", "n1"], shape={"switch_name": "leaf"})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    out = s.step(3000)
    assert out.decision is not None and out.decision.action == Action.FAILOVER
    warned = plan_node(topo("n0", switch_name="leaf")).warnings
    assert len(warned) == 8
    assert warned[3] == (
        "GPU 3: backup mlx5_2/1 hangs off the same fabric switch leaf as primary mlx5_3/1; "
        "losing that switch loses both"
    )
    assert out.warnings == warned + plan_node(topo("n1", switch_name="leaf")).warnings
    assert out.decision.plan["warnings"] == list(out.warnings)


def test_a_stock_nccl_job_that_lost_a_gpu_restarts() -> None:
    """No virtual NIC lost a device, but a GPU is gone: NCCL has no path for its rank (it
    used to decide "none", and again on every pass)."""
    spec = NcclSpec((2, 29, 7), port_failover=True, merged_nics=(frozenset({"mlx5_2", "mlx5_3"}),))
    s = Story(["n0", "n1"], job_kw={"nccl": spec})
    s.faults[1] = FaultEvidence(1, "n0", "gpu7", 7, FaultKind.GPU_LOST, at(3000))
    s.lost_gpus["n0"] = 7
    d = s.step(3000).decision
    assert d is not None
    assert (d.trigger, d.action) == ("fault:1", Action.RESTART)
    assert (d.inputs["path_available"], d.costs_s["none"]) == (False, None)
    assert d.plan["nccl"]["outcome"] == "untouched"
    assert s.desired.mode == Mode.RESTARTING


def test_a_measured_k_that_decides_none_is_kept_and_decides_once() -> None:
    """A stock-NCCL job without port recovery stays failed over after its fail-back; a k
    measured then, with no device of it lost, is "none": recorded with its k, once."""
    spec = NcclSpec((2, 29, 7), port_failover=True, merged_nics=(frozenset({"mlx5_2", "mlx5_3"}),))
    s = Story(["n0", "n1"], comm_channels=None, job_kw={"nccl": spec, "repair_estimate_s": 50})
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.step(3000)
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    s.step(3220)
    s.checkpoint = CheckpointSeen(8, at(3300), at(3300))
    s.step(3300)  # keep running degraded, at the failover's k
    before = s.desired
    assert (before.mode, dict(before.moved), before.k) == (Mode.FAILED_OVER, {}, 1.5)
    s.measured_k = 1.3
    out = s.step(3400)
    d = out.decision
    assert d is not None
    assert (d.trigger, d.action, d.fault_key) == ("measured_k:1.3000", Action.NONE, None)
    assert d.reason == (
        "NCCL 2.29.7 with port failover: no rank's virtual NIC lost a device: measured k 1.300 "
        "replaces 1.500: no rank of this job uses the failed port as its primary; only backup "
        "redundancy is reduced"
    )
    assert (d.inputs["k"], d.inputs["path_available"]) == (1.3, True)
    assert d.costs_s["none"] == 200.0
    assert d.saved_gpu_s == 0.0
    assert out.desired == replace(before, k=1.3)
    assert s.step(3500).decision is None
