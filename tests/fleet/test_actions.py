"""Kubernetes and Slurm actions against recording stand-ins: the real client, real argv."""

from __future__ import annotations

import json
import os
import stat
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from railover_testing.agents import wait_until
from railover_testing.local import local_service
from scheduler_svc.config import Settings
from scheduler_svc.fleet import EventType, emit
from scheduler_svc.fleet.actions import NodeFlag, node_flags, requeue_job
from scheduler_svc.fleet.events import CONFIG_KEY, FleetTargets
from scheduler_svc.fleet.kubernetes import CONDITION_TYPE, TAINT_KEY, KubernetesActions
from scheduler_svc.fleet.slurm import render
from scheduler_svc.fleet.webhooks import DeliveryFailed
from scheduler_svc.store.db import make_engine, make_sessionmaker
from tests.fleet.conftest import K8sStandIn
from tests.fleet.helpers import fast, fault, two_jobs

SMP = "application/strategic-merge-patch+json"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


class _Resp:
    def __init__(self, payload: Any) -> None:
        self.data = json.dumps(payload)


def _as_model(payload: Any, model: str) -> Any:
    """Deserialise with the client's own models: unknown or misspelt fields would vanish."""
    return client.ApiClient().deserialize(_Resp(payload), model)


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return type(value).__name__ if not isinstance(value, str) else "str"


def _roundtrips(payload: dict[str, Any], model: str) -> None:
    """Every field survives the client's model (times come back as +00:00, still strings)."""
    again = client.ApiClient().sanitize_for_serialization(_as_model(payload, model))
    assert _shape(again) == _shape(payload), f"{model} does not know some field: {payload}"


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


@pytest.mark.parametrize(
    ("policy", "taint", "cordon"),
    [("taint", True, False), ("cordon", False, True), ("taint_and_cordon", True, True)],
)
def test_k8s_flag_node_requests_are_what_the_api_accepts(
    k8s: K8sStandIn, policy: str, taint: bool, cordon: bool
) -> None:
    settings = Settings(k8s_enabled=True, k8s_api_url=k8s.url, k8s_node_policy=policy)
    actions = KubernetesActions(settings)
    actions.flag_node(NodeFlag("n7", "mlx5_2/1 flapping", "mlx5_2", 1), event_id="e-1", now=NOW)
    calls = [(c.method, c.path, c.content_type) for c in k8s.calls]
    expected = [("PATCH", "/api/v1/nodes/n7/status", SMP)]
    if taint:
        expected.append(("GET", "/api/v1/nodes/n7", "application/json"))
    expected.append(("PATCH", "/api/v1/nodes/n7", SMP))
    expected.append(("POST", "/api/v1/namespaces/default/events", "application/json"))
    assert calls == expected
    condition = k8s.calls[0].body["status"]["conditions"]
    assert len(condition) == 1 and condition[0]["type"] == CONDITION_TYPE
    assert condition[0]["status"] == "True" and condition[0]["message"] == "mlx5_2/1 flapping"
    _roundtrips(condition[0], "V1NodeCondition")
    patch = k8s.calls[-2].body
    if taint:
        # The whole list (taints have no merge key), guarded by the version we read
        # (43: the condition's status patch just before moved it on from 42).
        assert patch["metadata"] == {"resourceVersion": "43"}
        assert patch["spec"]["taints"] == [
            {"key": "gpu.example/maintenance", "effect": "PreferNoSchedule"},
            {"key": TAINT_KEY, "value": "mlx5_2", "effect": "NoSchedule"},
        ]
        for t in patch["spec"]["taints"]:
            _roundtrips(t, "V1Taint")
    assert patch["spec"].get("unschedulable") is (True if cordon else None)
    event = k8s.calls[-1].body
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n7"}
    assert event["type"] == "Warning" and event["reason"] == "RNICDegraded"
    _roundtrips(event, "CoreV1Event")


def test_k8s_event_retry_is_idempotent(k8s: K8sStandIn) -> None:
    settings = Settings(k8s_enabled=True, k8s_api_url=k8s.url, k8s_node_policy="condition")
    actions = KubernetesActions(settings)
    flag = NodeFlag("n1", "restart")
    actions.flag_node(flag, event_id="same", now=NOW)
    actions.flag_node(flag, event_id="same", now=NOW)  # AlreadyExists is taken as done
    posts = [(c.body["metadata"]["name"], c.status) for c in k8s.calls if c.method == "POST"]
    assert [status for _, status in posts] == [201, 409]
    assert posts[0][0] == posts[1][0]
    # Another event id is another Event object.
    actions.flag_node(flag, event_id="other", now=NOW)
    assert [c.status for c in k8s.calls if c.method == "POST"] == [201, 409, 201]


def test_k8s_errors_other_than_already_exists_fail_the_delivery(k8s: K8sStandIn) -> None:
    """A taint patch racing another writer meets 409 Conflict: retried later, not dropped."""
    settings = Settings(k8s_enabled=True, k8s_api_url=k8s.url, k8s_node_policy="taint")
    k8s.racing_writer = True
    with pytest.raises(DeliveryFailed) as info:
        KubernetesActions(settings).flag_node(
            NodeFlag("n7", "x", "mlx5_2", 1), event_id="e", now=NOW
        )
    assert str(info.value) == "kubernetes 409 Conflict: node n7"
    assert info.value.status == 409
    assert [(c.method, c.status) for c in k8s.calls] == [
        ("PATCH", 200),
        ("GET", 200),
        ("PATCH", 409),
    ]
    # Fresh data on the retry: the patch carries the version it read and goes through.
    k8s.racing_writer = False
    KubernetesActions(settings).flag_node(NodeFlag("n7", "x", "mlx5_2", 1), event_id="e", now=NOW)
    assert [c.status for c in k8s.calls[3:]] == [200, 200, 200, 201]


def test_action_table() -> None:
    restart = {"action": "restart", "job_id": "j1", "fault": {"node": "n0", "device": "mlx5_0"}}
    failover = {**restart, "action": "failover"}
    flagged = {"node": "n3", "device": "mlx5_1", "port": 1, "reason": "flapping"}
    dc, mf = EventType.DECISION_CREATED, EventType.MAINTENANCE_FLAG
    assert [f.node for f in node_flags(dc, restart)] == ["n0"]
    assert node_flags(dc, failover) == [] and requeue_job(dc, failover) is None
    assert requeue_job(dc, restart) == "j1" and requeue_job(mf, flagged) is None
    assert node_flags(mf, flagged) == [NodeFlag("n3", "flapping", "mlx5_1", 1)]
    assert node_flags(EventType.SWITCH_FAULT, {"switch": "s"}) == []
    assert render('scontrol update NodeName={node} Reason="{reason}"', node="n1", reason="a b") == [
        "scontrol",
        "update",
        "NodeName=n1",
        "Reason=a b",
    ]


def test_service_drives_k8s_and_slurm(tmp_path: Path, db_url: str, k8s: K8sStandIn) -> None:
    script, log = scontrol(tmp_path)
    db = db_url
    settings = fast(
        db,
        k8s_enabled=True,
        k8s_api_url=k8s.url,
        slurm_enabled=True,
        slurm_drain_command=f'{script} update NodeName={{node}} State=DRAIN Reason="{{reason}}"',
        slurm_requeue_command=f"{script} requeue {{job_id}}",
    )
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        two_jobs(http)
        # Early in the checkpoint interval: restarting is cheaper, so the job restarts.
        decision = fault(http, "n0", "mlx5_0", 100)
        assert decision
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

        def both_acted() -> bool:
            lines = log.read_text().splitlines() if log.exists() else []
            return len(lines) >= 2 and len([c for c in k8s.calls if c.method == "POST"]) >= 2

        assert wait_until(both_acted, timeout=20)
    lines = log.read_text().splitlines()
    argvs = [json.loads(line) for line in lines]
    assert ["requeue", "j1"] in argvs
    assert [
        "update",
        "NodeName=n3",
        "State=DRAIN",
        "Reason=railover: port flapped 5x",
    ] in argvs
    patched = {c.path for c in k8s.calls if c.method == "PATCH"}
    assert patched == {
        "/api/v1/nodes/n0/status",
        "/api/v1/nodes/n0",
        "/api/v1/nodes/n3/status",
        "/api/v1/nodes/n3",
    }
    events = [c.body for c in k8s.calls if c.method == "POST"]
    assert sorted(e["involvedObject"]["name"] for e in events) == ["n0", "n3"]
    assert os.access(script, os.X_OK)
