"""Slurm actions against real slurmctld/slurmd (tests/slurm/cluster.py).

Every outcome is read back from Slurm itself (`scontrol show node|job`, `squeue`,
`sinfo`), never from what Railover thinks it sent.
"""

from __future__ import annotations

from typing import Any

import httpx

from railover_testing.local import local_service
from scheduler_svc.config import Settings
from scheduler_svc.fleet import EventType
from scheduler_svc.fleet.actions import node_clears, node_flags, requeue_job
from scheduler_svc.fleet.slurm import SlurmActions
from tests.fleet.helpers import fast, fault
from tests.scheduler_svc.helpers import job_body, register_nodes
from tests.slurm.cluster import RUNS_JOBS, SlurmCluster

DC = EventType.DECISION_CREATED


def decision(action: str, job_id: str, node: str, decision_id: str = "d-0001") -> dict[str, Any]:
    """io.railover.decision.created data, as fleet.events.emit_decision writes it."""
    return {
        "decision_id": decision_id,
        "job_id": job_id,
        "action": action,
        "fault": {"node": node, "device": "mlx5_3", "port": 1, "kind": "port_down"},
    }


def deliver(settings: Settings, event_type: str, data: dict[str, Any]) -> None:
    """What the delivery worker does for a Slurm target (fleet.worker.DeliveryWorker._act)."""
    scontrol = SlurmActions(settings)
    for flag in node_flags(event_type, data):
        scontrol.flag(flag)
    for clear in node_clears(event_type, data):
        scontrol.clear(clear)
    job = requeue_job(event_type, data)
    if job is not None:
        scontrol.requeue(job)


def running_job(slurm: SlurmCluster) -> str:
    job = slurm.submit()
    slurm.wait(f"job {job} running", lambda: slurm.squeue(job) == "R")
    assert slurm.job(job)["NodeList"] == RUNS_JOBS
    return job


def test_restart_drains_the_faulty_node_and_requeues_the_job(slurm: SlurmCluster) -> None:
    job = running_job(slurm)
    settings = Settings(slurm_enabled=True)
    data = decision("restart", job, RUNS_JOBS, "d-restart-1")
    deliver(settings, DC, data)
    node = slurm.node(RUNS_JOBS)
    assert "DRAIN" in node["State"]
    assert node["Reason"].startswith("railover: decision d-restart-1: ")
    assert "mlx5_3/1 port_down" in node["Reason"]
    assert f"job {job} restarts" in node["Reason"]
    # Requeued, and it cannot start again on the drained node (the only one with a slurmd).
    slurm.wait("requeued", lambda: slurm.squeue(job) == "PD")
    assert int(slurm.job(job)["Restarts"]) == 1
    assert "railover: decision d-restart-1" in slurm.run("sinfo", "-R", "-h", "-o", "%E")
    # A retried delivery repeats nothing harmful: still drained, still one requeue.
    deliver(settings, DC, data)
    assert int(slurm.job(job)["Restarts"]) == 1 and "DRAIN" in slurm.node(RUNS_JOBS)["State"]

    # The port is repaired: the fail-back resumes the node (Slurm starts the requeued job
    # only after its requeue delay, so the node is free until then).
    deliver(settings, DC, decision("failback", job, RUNS_JOBS, "d-back-1"))
    resumed = slurm.node(RUNS_JOBS)
    assert "DRAIN" not in resumed["State"] and "Reason" not in resumed


def test_restart_scaled_requeues_the_job_without_the_node(slurm: SlurmCluster) -> None:
    job = running_job(slurm)
    settings = Settings(slurm_enabled=True)
    data = decision("restart_scaled", job, RUNS_JOBS)
    deliver(settings, DC, data)
    slurm.wait("requeued", lambda: slurm.squeue(job) == "PD")
    info = slurm.job(job)
    assert info["ExcNodeList"] == RUNS_JOBS
    assert info["JobState"] == "PENDING" and int(info["Restarts"]) == 1
    # Released: it waits for nodes, not for an operator.
    assert info["Reason"] != "JobHeldUser"
    assert "DRAIN" not in slurm.node(RUNS_JOBS)["State"]
    assert slurm.squeue(job) == "PD"
    deliver(settings, DC, data)  # a retry: no second requeue, the list unchanged
    again = slurm.job(job)
    assert again["ExcNodeList"] == RUNS_JOBS and int(again["Restarts"]) == 1


def test_failover_marks_the_node_degraded_in_sinfo_and_failback_clears_it(
    slurm: SlurmCluster,
) -> None:
    job = running_job(slurm)
    settings = Settings(slurm_enabled=True)
    deliver(settings, DC, decision("failover", job, RUNS_JOBS, "d-fo-7"))
    listing = slurm.run("sinfo", "-h", "-N", "-O", "NodeList:12,StateLong:12,Comment:200")
    row = next(line for line in listing.splitlines() if line.startswith(RUNS_JOBS))
    assert "railover: decision d-fo-7: " in row and "failed over: mlx5_3/1 port_down" in row
    # The job keeps running on its backup RNIC; the node is not drained.
    assert slurm.squeue(job) == "R" and "DRAIN" not in slurm.node(RUNS_JOBS)["State"]
    deliver(settings, DC, decision("failback", job, RUNS_JOBS, "d-fb-8"))
    assert "Comment" not in slurm.node(RUNS_JOBS)
    assert slurm.squeue(job) == "R"


def test_an_administrators_drain_and_comment_are_left_alone(slurm: SlurmCluster) -> None:
    settings = Settings(slurm_enabled=True)
    slurm.run("scontrol", "update", "NodeName=gpu03", "State=DRAIN", "Reason=bad DIMM")
    slurm.run("scontrol", "update", "NodeName=gpu02", "Comment=ticket 4711")
    # A restart decision about an already drained node keeps the administrator's reason ...
    deliver(settings, DC, decision("restart", "999999", "gpu03"))
    assert slurm.node("gpu03")["Reason"].startswith("bad DIMM")
    # ... and a failover adds to their comment rather than replacing it.
    deliver(settings, DC, decision("failover", "999999", "gpu02", "d-9"))
    assert slurm.node("gpu02")["Comment"].startswith("ticket 4711 | railover: decision d-9: ")
    # The repair takes only Railover's marks off.
    deliver(settings, DC, decision("failback", "999999", "gpu03"))
    deliver(settings, DC, decision("failback", "999999", "gpu02"))
    node = slurm.node("gpu03")
    assert "DRAIN" in node["State"] and node["Reason"].startswith("bad DIMM")
    assert slurm.node("gpu02")["Comment"] == "ticket 4711"


def test_service_restart_decision_drains_through_the_outbox(
    slurm: SlurmCluster, tmp_path: Any
) -> None:
    """The whole path: an agent's fault report, a restart decision, the delivery worker."""
    job = running_job(slurm)
    settings = fast(f"sqlite:///{tmp_path / 'railover.db'}", slurm_enabled=True)
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        register_nodes(http, ["gpu01", "gpu02"])
        assert http.post("/v1/jobs", json=job_body(job, ["gpu01", "gpu02"])).status_code == 201
        (decision_id,) = fault(http, RUNS_JOBS, "mlx5_0", 100)  # early: restarting is cheaper
        slurm.wait("drained by the service", lambda: "DRAIN" in slurm.node(RUNS_JOBS)["State"])
    reason = slurm.node(RUNS_JOBS)["Reason"]
    assert reason.startswith(f"railover: decision {decision_id}: job {job} restarts: mlx5_0/1")
    slurm.wait("requeued by the service", lambda: int(slurm.job(job)["Restarts"]) == 1)


def test_service_restart_scaled_requeues_without_the_dropped_node(
    slurm: SlurmCluster, tmp_path: Any
) -> None:
    """No spare node: the service's restart_scaled decision excludes the node it drops."""
    job = running_job(slurm)
    settings = fast(f"sqlite:///{tmp_path / 'railover.db'}", slurm_enabled=True)
    # dp 2 x tp 8: each node is one DP replica; k = 3 and a 2 h wait for a spare node.
    layout: dict[str, Any] = {
        "dp_size": 2,
        "tp_size": 8,
        "allow_scaling": True,
        "spare_nodes": False,
        "node_replace_s": 7200,
        "slowdown_k": 3.0,
    }
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        register_nodes(http, ["gpu01", "gpu02"])
        body = job_body(job, ["gpu01", "gpu02"], **layout)
        assert http.post("/v1/jobs", json=body).status_code == 201
        (decision_id,) = fault(http, RUNS_JOBS, "mlx5_0", 100)
        (d,) = http.get(f"/v1/jobs/{job}/decisions").json()["decisions"]
        assert (d["decision_id"], d["action"]) == (decision_id, "restart_scaled")
        assert (d["drop_nodes"], d["new_dp_size"]) == ([RUNS_JOBS], 1)
        slurm.wait("requeued by the service", lambda: int(slurm.job(job)["Restarts"]) == 1)
        slurm.wait("excluded by the service", lambda: slurm.job(job)["ExcNodeList"] == RUNS_JOBS)
    info = slurm.job(job)
    assert info["JobState"] == "PENDING" and info["Reason"] != "JobHeldUser"
    # The node is not drained: other jobs may still use its healthy GPUs and RNICs.
    assert "DRAIN" not in slurm.node(RUNS_JOBS)["State"]
    assert (
        f"railover: decision {decision_id}: job {job} restarts at DP 1 without {RUNS_JOBS}"
        in (slurm.node(RUNS_JOBS)["Comment"])
    )
