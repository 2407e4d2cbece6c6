"""Kubernetes and Slurm actions against recording stand-ins: the real client, real argv."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from railover_testing.local import local_service
from railover_testing.waiting import wait_until
from scheduler_svc.config import Settings
from scheduler_svc.fleet import EventType, emit
from scheduler_svc.fleet.actions import (
    NodeClear,
    NodeFlag,
    Requeue,
    SlurmMark,
    node_clears,
    node_flags,
    requeue_job,
    wants_k8s,
)
from scheduler_svc.fleet.events import CONFIG_KEY, FleetTargets
from scheduler_svc.fleet.kubernetes import (
    CONDITION_TYPE,
    CORDON_ANNOTATION,
    TAINT_KEY,
    KubernetesActions,
)
from scheduler_svc.fleet.slurm import render
from scheduler_svc.fleet.webhooks import DeliveryFailed
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.maintenance import MaintenanceRepo
from tests.fleet.conftest import SMP, K8sStandIn
from tests.fleet.helpers import fast, fault, two_jobs

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in scontrol that appends its argv as one JSON line."""
    log = tmp_path / "scontrol.log"
    script = tmp_path / "scontrol"
    script.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


def taints(api: K8sStandIn, node: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = api.node(node)["spec"].get("taints", [])
    return found


def events_about(api: K8sStandIn, node: str) -> list[dict[str, Any]]:
    return [e for e in api.events.values() if e["involvedObject"]["name"] == node]


RESTART = NodeFlag(
    "n7", "decision d-1: job j1 restarts: mlx5_2/1 port_down", "mlx5_2", 1, "d-1", True
)
FAILOVER = NodeFlag(
    "n7", "decision d-2: job j1 failed over: mlx5_2/1 port_down", "mlx5_2", 1, "d-2"
)
OTHER = {"key": "gpu.example/maintenance", "effect": "PreferNoSchedule"}


@pytest.mark.parametrize(
    ("policy", "flag", "taint", "cordon"),
    [
        ("taint_and_cordon", RESTART, True, True),
        ("taint_and_cordon", FAILOVER, True, False),
        ("taint", RESTART, True, False),
        ("cordon", RESTART, False, True),
        ("cordon", FAILOVER, False, False),
        ("condition", RESTART, False, False),
    ],
)
def test_k8s_flag_node(
    k8s: K8sStandIn, policy: str, flag: NodeFlag, taint: bool, cordon: bool
) -> None:
    settings = Settings(k8s_enabled=True, k8s_api_url=k8s.url, k8s_node_policy=policy)
    KubernetesActions(settings).flag_node(flag, event_id="e-1", now=NOW)
    assert k8s.refused() == []
    assert all(c.content_type == SMP for c in k8s.calls if c.method == "PATCH")
    node = k8s.node("n7")
    cond = k8s.condition("n7", CONDITION_TYPE)
    assert cond is not None and cond["status"] == "True" and cond["message"] == flag.reason
    assert k8s.condition("n7", "Ready") is not None  # the kubelet's own are kept
    ours = {"key": TAINT_KEY, "value": "mlx5_2", "effect": "NoSchedule"}
    assert taints(k8s, "n7") == ([OTHER, ours] if taint else [OTHER])
    assert node["spec"].get("unschedulable", False) is cordon
    assert (CORDON_ANNOTATION in node["metadata"].get("annotations", {})) is cordon
    (event,) = events_about(k8s, "n7")
    assert event["type"] == "Warning" and event["reason"] == "RNICDegraded"
    assert f"decision {flag.decision_id}" in event["message"]


def test_k8s_cycle_restart_then_repair(k8s: K8sStandIn) -> None:
    actions = KubernetesActions(Settings(k8s_enabled=True, k8s_api_url=k8s.url))
    actions.flag_node(RESTART, event_id="e-1", now=NOW)
    assert k8s.node("n7")["spec"]["unschedulable"] is True
    actions.clear_node(NodeClear("n7", "decision d-3: fails back", "d-3"), event_id="e-2", now=NOW)
    assert k8s.refused() == []
    node = k8s.node("n7")
    assert k8s.condition("n7", CONDITION_TYPE) is None
    assert k8s.condition("n7", "Ready") is not None
    assert taints(k8s, "n7") == [OTHER]  # someone else's taint stays
    assert node["spec"]["unschedulable"] is False
    assert CORDON_ANNOTATION not in node["metadata"].get("annotations", {})
    repaired = [e for e in events_about(k8s, "n7") if e["reason"] == "RNICRepaired"]
    assert len(repaired) == 1 and repaired[0]["type"] == "Normal"
    assert "decision d-3" in repaired[0]["message"]
    # Repeating the repair changes nothing and fails nothing.
    actions.clear_node(NodeClear("n7", "again"), event_id="e-2", now=NOW)
    assert k8s.refused() == [] and k8s.node("n7")["spec"] == node["spec"]


def test_k8s_repair_leaves_an_administrators_cordon(k8s: K8sStandIn) -> None:
    k8s.nodes["n7"]["spec"]["unschedulable"] = True  # `kubectl cordon` by someone else
    actions = KubernetesActions(Settings(k8s_enabled=True, k8s_api_url=k8s.url))
    actions.flag_node(RESTART, event_id="e-1", now=NOW)
    assert CORDON_ANNOTATION not in k8s.node("n7")["metadata"].get("annotations", {})
    actions.clear_node(NodeClear("n7", "repaired"), event_id="e-2", now=NOW)
    assert k8s.node("n7")["spec"]["unschedulable"] is True
    assert taints(k8s, "n7") == [OTHER]


def test_k8s_stale_read_is_a_conflict_then_retried(k8s: K8sStandIn) -> None:
    """Someone adds a taint between our read and our patch: 409, and the retry keeps it."""
    theirs = {"key": "example.com/other", "effect": "NoSchedule"}
    k8s.interfere_once = lambda node: node["spec"]["taints"].append(theirs)
    actions = KubernetesActions(Settings(k8s_enabled=True, k8s_api_url=k8s.url))
    with pytest.raises(DeliveryFailed) as failed:
        actions.flag_node(FAILOVER, event_id="e-1", now=NOW)
    assert failed.value.status == 409
    assert [c.status for c in k8s.calls if c.method == "PATCH"][-1] == 409
    actions.flag_node(FAILOVER, event_id="e-1", now=NOW)
    keys = [t["key"] for t in taints(k8s, "n7")]
    assert keys == ["gpu.example/maintenance", "example.com/other", TAINT_KEY]


def test_k8s_event_retry_is_already_exists(k8s: K8sStandIn) -> None:
    settings = Settings(k8s_enabled=True, k8s_api_url=k8s.url, k8s_node_policy="condition")
    actions = KubernetesActions(settings)
    actions.flag_node(FAILOVER, event_id="same", now=NOW)
    actions.flag_node(FAILOVER, event_id="same", now=NOW)
    posts = [c.status for c in k8s.calls if c.method == "POST"]
    assert posts == [201, 409] and len(events_about(k8s, "n7")) == 1


def test_stand_in_refuses_what_the_api_server_refuses(k8s: K8sStandIn) -> None:
    """Guards the guard: each of these must be refused, the node left as it was."""
    core = client.CoreV1Api(KubernetesActions(Settings(k8s_api_url=k8s.url)).core.api_client)
    before = k8s.node("n7")
    bad_patches = [
        # a misspelt field (strict schema: unknown fields refused)
        (
            "status",
            {"status": {"conditions": [{"type": "X", "status": "True", "lastHeartbeat": "x"}]}},
        ),
        # a condition without its required status
        ("status", {"status": {"conditions": [{"type": "X"}]}}),
        # an effect the API server does not know, and a time that is not RFC 3339
        ("node", {"spec": {"taints": [{"key": "k", "effect": "NoWay"}]}}),
        ("node", {"spec": {"taints": [{"key": "k", "effect": "NoExecute", "timeAdded": "now"}]}}),
        # a wrong type
        ("node", {"spec": {"unschedulable": "yes"}}),
    ]
    for target, body in bad_patches:
        call = core.patch_node_status if target == "status" else core.patch_node
        with pytest.raises(ApiException) as refused:
            call("n7", body)
        assert refused.value.status == 422, body
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "Not_A_Name"},
        "involvedObject": {"kind": "Node", "name": "n7"},
        "type": "Warning",
    }
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_event("default", event)
    assert refused.value.status == 422
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_event(
            "default", {**event, "metadata": {"name": "ok"}, "type": "Fatal"}
        )
    assert refused.value.status == 422
    assert k8s.node("n7") == before and k8s.events == {}
    assert len(k8s.refused()) == len(bad_patches) + 2


def test_action_table() -> None:
    fault = {"node": "n0", "device": "mlx5_0", "port": 1, "kind": "port_down"}
    restart = {"action": "restart", "job_id": "j1", "decision_id": "d1", "fault": fault}
    scaled = {**restart, "action": "restart_scaled"}
    failover = {**restart, "action": "failover"}
    failback = {**restart, "action": "failback"}
    flagged = {"node": "n3", "device": "mlx5_1", "port": 1, "reason": "flapping"}
    dc, mf, mc = (
        EventType.DECISION_CREATED,
        EventType.MAINTENANCE_FLAG,
        EventType.MAINTENANCE_CLEARED,
    )
    (r,) = node_flags(dc, restart)
    assert (r.node, r.decision_id, r.cordon, r.slurm) == ("n0", "d1", True, SlurmMark.DRAIN)
    assert r.reason == "decision d1: job j1 restarts: mlx5_0/1 port_down"
    (f,) = node_flags(dc, failover)
    assert (f.cordon, f.slurm) == (False, SlurmMark.COMMENT)
    (sc,) = node_flags(dc, scaled)
    assert (sc.cordon, sc.slurm) == (False, SlurmMark.COMMENT)
    assert requeue_job(dc, restart) == Requeue("j1")
    assert requeue_job(dc, scaled) == Requeue("j1", ("n0",))  # stored before drop_nodes
    # The decision names the nodes to drop; only the fault's node has its device named.
    dropping = {**scaled, "drop_nodes": ["n0", "n5"], "new_dp_size": 3}
    assert requeue_job(dc, dropping) == Requeue("j1", ("n0", "n5"))
    assert node_flags(dc, dropping) == [
        NodeFlag("n0", "decision d1: job j1 restarts at DP 3 without n0, n5", "mlx5_0", 1, "d1"),
        NodeFlag("n5", "decision d1: job j1 restarts at DP 3 without n0, n5", decision_id="d1"),
    ]
    assert requeue_job(dc, failover) is None and requeue_job(mf, flagged) is None
    assert node_flags(dc, failback) == [] and [c.node for c in node_clears(dc, failback)] == ["n0"]
    assert node_flags(mf, flagged) == [
        NodeFlag("n3", "flapping", "mlx5_1", 1, slurm=SlurmMark.DRAIN)
    ]
    assert [c.node for c in node_clears(mc, flagged)] == ["n3"]
    assert node_flags(EventType.SWITCH_FAULT, {"switch": "s"}) == []
    assert not wants_k8s(dc, {**restart, "action": "none"})
    assert render('scontrol update NodeName={node} Reason="{reason}"', node="n1", reason="a b") == [
        "scontrol",
        "update",
        "NodeName=n1",
        "Reason=a b",
    ]


def test_service_drives_k8s_and_slurm(tmp_path: Path, k8s: K8sStandIn, db_url: str) -> None:
    script, log = scontrol(tmp_path)
    db = db_url
    settings = fast(
        db,
        k8s_enabled=True,
        k8s_api_url=k8s.url,
        slurm_enabled=True,
        slurm_drain_command=f'{script} update NodeName={{node}} State=DRAIN Reason="{{reason}}"',
        slurm_requeue_command=f"{script} requeue {{job_id}}",
        slurm_scontrol=str(script),
    )
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        two_jobs(http)
        # Early in the checkpoint interval: restarting is cheaper, so the job restarts.
        (decision,) = fault(http, "n0", "mlx5_0", 100)
        assert http.get("/v1/jobs/j1/decisions").json()["decisions"][0]["action"] == "restart"
        # The coordination code flags a flapping port through emit().
        sessions = make_sessionmaker(make_engine(db))
        with sessions(info={CONFIG_KEY: FleetTargets(k8s=True, slurm=True)}) as s, s.begin():
            emit(
                s,
                EventType.MAINTENANCE_FLAG,
                job_id=None,
                subject="node/n3/mlx5_1/1",
                data={"node": "n3", "device": "mlx5_1", "port": 1, "reason": "port flapped 5x"},
            )

        flag_drain = ["update", "NodeName=n3", "State=DRAIN", "Reason=railover: port flapped 5x"]

        def acted() -> bool:
            # Both deliveries done: the restart's four calls, and the flag's drain (its event
            # goes out on its own lane, in any order with the restart's).
            if not log.exists() or len(k8s.events) < 2:
                return False
            lines = log.read_text().splitlines()  # compared whole: a line mid-write is not one
            return json.dumps(["requeue", "j1"]) in lines and json.dumps(flag_drain) in lines

        assert wait_until(acted, timeout=30), (log.read_text() if log.exists() else "", k8s.events)
    argvs = [json.loads(line) for line in log.read_text().splitlines()]
    # The faulty node is drained before the job is requeued, so it cannot come back there.
    drain = [
        "update",
        "NodeName=n0",
        "State=DRAIN",
        f"Reason=railover: decision {decision}: job j1 restarts: mlx5_0/1 link_down",
    ]
    assert drain in argvs, argvs
    assert argvs.index(drain) < argvs.index(["requeue", "j1"])
    assert flag_drain in argvs
    assert k8s.refused() == []
    assert k8s.node("n0")["spec"]["unschedulable"] is True  # restart: cordoned
    assert "unschedulable" not in k8s.node("n3")["spec"]  # a flag: tainted only
    for node in ("n0", "n3"):
        assert TAINT_KEY in [t["key"] for t in taints(k8s, node)]
        assert k8s.condition(node, CONDITION_TYPE) is not None
    (event,) = events_about(k8s, "n0")
    assert f"decision {decision}" in event["message"]
    assert len(events_about(k8s, "n3")) == 1
    assert os.access(script, os.X_OK)


def test_clearing_a_maintenance_flag_repairs_the_node(
    tmp_path: Path, k8s: K8sStandIn, db_url: str
) -> None:
    """DELETE /v1/maintenance-flags/{id}: Railover's taint and condition come off, in
    Kubernetes (the stand-in's stored node) and in Slurm (comment and drain reads)."""
    script, log = scontrol(tmp_path)
    db = db_url
    settings = fast(
        db,
        k8s_enabled=True,
        k8s_api_url=k8s.url,
        slurm_enabled=True,
        slurm_drain_command=f'{script} update NodeName={{node}} State=DRAIN Reason="{{reason}}"',
        slurm_scontrol=str(script),
    )

    def wait(what: str, probe: Callable[[], bool]) -> None:
        assert wait_until(probe, timeout=30), what

    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        two_jobs(http)
        sessions = make_sessionmaker(make_engine(db))
        with sessions(info={CONFIG_KEY: FleetTargets(k8s=True, slurm=True)}) as s, s.begin():
            row = MaintenanceRepo(s).flag(
                m.MaintenanceFlag(
                    node="n3", device="mlx5_1", port=1, flagged_at=NOW, reason="flapped 5x"
                )
            )
            assert row is not None
            emit(
                s,
                EventType.MAINTENANCE_FLAG,
                job_id=None,
                subject="node/n3/mlx5_1/1",
                data={"node": "n3", "device": "mlx5_1", "port": 1, "reason": "flapped 5x"},
            )
            flag_id = row.id
        wait("tainted", lambda: TAINT_KEY in [t["key"] for t in taints(k8s, "n3")])
        r = http.delete(f"/v1/maintenance-flags/{flag_id}")
        assert r.status_code == 200, r.text
        wait("untainted", lambda: TAINT_KEY not in [t["key"] for t in taints(k8s, "n3")])
        wait("repair event", lambda: len(events_about(k8s, "n3")) == 2)
    assert k8s.condition("n3", CONDITION_TYPE) is None
    assert k8s.refused() == []
    repaired = [e for e in events_about(k8s, "n3") if e["reason"] == "RNICRepaired"]
    assert "maintenance flag" in repaired[0]["message"]
    wait("slurm read the node", lambda: log.read_text().count('"show", "node"') >= 2)
