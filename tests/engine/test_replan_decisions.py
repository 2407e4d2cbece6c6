"""A decision without a cost question: a job that starts on its backups."""

from __future__ import annotations

from scheduler_svc.engine.nccl import NcclSpec
from scheduler_svc.engine.reconcile import Action, Mode
from tests.scheduler_svc.test_engine_reconcile import Story, down


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
