"""A restart without the faulty node, end to end: the decision names what the fleet executes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from railover_testing.local import local_service
from railover_testing.waiting import wait_until
from scheduler_svc.fleet.kubernetes import CONDITION_TYPE, TAINT_KEY
from tests.fleet.conftest import K8sStandIn, Receiver
from tests.fleet.helpers import fast, fault, subscribe
from tests.fleet.test_actions import scontrol, taints
from tests.scheduler_svc.helpers import job_body, register_nodes

# dp 4 x tp 4 on two 8-GPU nodes: each node holds ranks of two DP replicas (n0: 0 and 1).
# No spare node (a replacement takes 2 h) and k = 3: dropping the node is cheapest.
SCALED: dict[str, Any] = {
    "dp_size": 4,
    "tp_size": 4,
    "allow_scaling": True,
    "spare_nodes": False,
    "node_replace_s": 7200,
    "slowdown_k": 3.0,
}


def test_no_spare_restart_names_the_dropped_node_and_the_fleet_excludes_it(
    tmp_path: Path, k8s: K8sStandIn, receiver: Receiver, db_url: str
) -> None:
    script, log = scontrol(tmp_path)
    settings = fast(
        db_url,
        k8s_enabled=True,
        k8s_api_url=k8s.url,
        slurm_enabled=True,
        slurm_requeue_command=f"{script} requeue {{job_id}}",
        slurm_scontrol=str(script),
    )
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        register_nodes(http, ["n0", "n1", "n2", "n3"])
        subscribe(http, receiver.url, event_types=["io.railover.decision.created"])
        r = http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"], **SCALED))
        assert r.status_code == 201, r.text
        (decision_id,) = fault(http, "n0", "mlx5_0", 100)
        (d,) = http.get("/v1/jobs/j1/decisions").json()["decisions"]
        assert d["decision_id"] == decision_id and d["action"] == "restart_scaled"
        assert d["drop_nodes"] == ["n0"] and d["new_dp_size"] == 2
        assert d["plan"]["drop_nodes"] == ["n0"] and d["plan"]["new_dp_size"] == 2
        assert d["plan"]["dropped_replicas"] == [0, 1]
        assert d["inputs"]["new_dp_size"] == 2 and d["inputs"]["dp_size"] == 4
        # failover 30 + 3·3500 + 600; restart waits 7200 s; DP 4 -> 2 runs the hour twice.
        assert d["costs_s"] == {
            "failover": 11130.0,
            "restart": 11430.0,
            "restart_scaled": 7830.0,
            "none": None,
        }
        assert d["costs_gpu_s"]["restart_scaled"] == 7830.0 * 16 * 2 / 4
        assert d["saved_gpu_s"] == 0.0
        assert d["reason"].endswith("; drop n0 (DP replicas 0, 1): DP 4 -> 2")
        assert http.get("/v1/jobs/j1").json()["mode"] == "restarting"

        (got,) = receiver.wait_for(1)
        data = got.event["data"]
        assert got.event["type"] == "io.railover.decision.created"
        assert (data["decision_id"], data["action"]) == (decision_id, "restart_scaled")
        assert (data["drop_nodes"], data["new_dp_size"]) == (["n0"], 2)

        def acted() -> bool:
            requeued = log.exists() and "ExcNodeList" in log.read_text()
            return requeued and any(t["key"] == TAINT_KEY for t in taints(k8s, "n0"))

        assert wait_until(acted, timeout=30), (log.read_text() if log.exists() else "", k8s.calls)
    argvs = [json.loads(line) for line in log.read_text().splitlines()]
    # Held while pending, so it cannot start again before n0 is excluded.
    assert argvs.index(["requeuehold", "j1"]) < argvs.index(
        ["update", "JobId=j1", "ExcNodeList=n0"]
    )
    assert ["requeue", "j1"] not in argvs  # not the plain whole-job requeue
    # Kubernetes: n0 tainted with Railover's condition, not cordoned; n1 stays as it was.
    assert k8s.condition("n0", CONDITION_TYPE) is not None
    assert "unschedulable" not in k8s.node("n0")["spec"]
    assert TAINT_KEY not in [t["key"] for t in taints(k8s, "n1")]
    assert k8s.refused() == []


def test_a_scalable_job_must_describe_every_rank_with_its_layout(db_url: str) -> None:
    with local_service(fast(db_url)) as url, httpx.Client(base_url=url, timeout=30) as http:
        register_nodes(http, ["n0", "n1"])
        body = job_body("j1", ["n0", "n1"], **(SCALED | {"tp_size": 2}))
        r = http.post("/v1/jobs", json=body)
        assert r.status_code == 422, r.text
        (problem,) = r.json()["fields"]
        assert problem["field"] == "allow_scaling"
        assert problem["problem"] == (
            "Value error, needs dp_size x tp_size x pp_size (4 x 2 x 1) to equal the 16 ranks"
        )
        # Without allow_scaling the layout is information only, as before.
        plain = job_body("j1", ["n0", "n1"], dp_size=4, tp_size=2)
        assert http.post("/v1/jobs", json=plain).status_code == 201
