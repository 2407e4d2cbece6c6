"""Stock NCCL: announced communicators, stall evidence and the job's declared CCL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from railover_testing.local import local_service
from railover_testing.waiting import wait_until
from scheduler_svc.config import Settings
from tests.scheduler_svc.helpers import event, job_body, register_nodes

NCCL = {
    "kind": "nccl",
    "version": "2.29.7",
    "port_failover": True,
    "merged_nics": [["mlx5_0", "mlx5_1"]],
}
WORLD = 0xF1F0000000000001  # above 2**63, as half of NCCL's hashed ids are
TP = 0x00000000000000A7


def announce(node: str, comm_id: int, rank: int, nranks: int, **extra: Any) -> dict[str, Any]:
    return event(
        node, "communicator", device=None, comm_id=comm_id, rank=rank, nranks=nranks, **extra
    )


def post(http: httpx.Client, *events: dict[str, Any]) -> httpx.Response:
    return http.post("/v1/events", json={"events": list(events)})


def test_announced_communicators_attach_to_the_job(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1"])
    assert http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"], ccl=NCCL)).status_code == 201
    assert http.get("/v1/jobs/j1").json()["ccl"]["port_failover"] is True
    r = post(
        http,
        announce("n0", WORLD, 3, 16),
        announce("n1", WORLD, 12, 16),  # the same comm_id from another rank: one communicator
        announce("n0", TP, 0, 8),  # a tensor-parallel group on n0
        event("n0", "progress", device=None, comm_id=WORLD, rank=3, ops_done=41, after_s=1),
    )
    assert r.status_code == 202, r.text
    got = http.get("/v1/jobs/j1/progress").json()
    assert got["communicators"] == [
        {"comm_id": TP, "channels": 8, "ranks": list(range(8)), "nranks": 8},
        {"comm_id": WORLD, "channels": 8, "ranks": [], "nranks": 16},
    ]
    assert [(p["comm_id"], p["rank"], p["ops_done"]) for p in got["progress"]] == [(WORLD, 3, 41)]
    # The group announced from n1 as well: it covers the job's ranks there too.
    post(http, announce("n1", TP, 1, 8))
    comms = http.get("/v1/jobs/j1/progress").json()["communicators"]
    assert comms[0]["ranks"] == list(range(16))
    # Nothing about announcements is a fault.
    assert http.get("/v1/jobs/j1/decisions").json()["decisions"] == []


def test_a_shared_node_needs_the_job_named(http: httpx.Client) -> None:
    register_nodes(http, ["n0"])
    a = job_body("a", ["n0"], gpus=4)
    b = job_body("b", ["n0"], gpus=4)
    b["ranks"] = [{"rank": r["rank"], "node": "n0", "gpu": r["gpu"] + 4} for r in b["ranks"]]
    assert http.post("/v1/jobs", json=a).status_code == 201
    assert http.post("/v1/jobs", json=b).status_code == 201
    post(http, announce("n0", 5, 0, 4), announce("n0", 6, 0, 4, job_id="b"))
    assert http.get("/v1/jobs/a/progress").json()["communicators"] == []
    assert [c["comm_id"] for c in http.get("/v1/jobs/b/progress").json()["communicators"]] == [6]


def test_a_declared_communicator_stays_as_declared(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1"])
    body = job_body(
        "j1", ["n0", "n1"], communicators=[{"comm_id": TP, "channels": 16, "ranks": [0, 1]}]
    )
    assert http.post("/v1/jobs", json=body).status_code == 201
    post(http, announce("n0", TP, 0, 2))
    assert http.get("/v1/jobs/j1/progress").json()["communicators"] == [
        {"comm_id": TP, "channels": 16, "ranks": [0, 1], "nranks": None}
    ]


def test_a_stall_is_evidence_stored_once(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1"])
    assert http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"])).status_code == 201
    stall = {
        "comm_id": WORLD,
        "rank": 3,
        "seq_number": 9000,
        "detail": {"func": "AllReduce", "open_s": 10.5},
    }
    r = post(
        http,
        announce("n0", WORLD, 3, 16),
        event("n0", "stall", device=None, after_s=5, **stall),
        # Resent under a new event id (an agent that lost its spool): the same stall.
        event("n0", "stall", device=None, after_s=5, **stall),
    )
    assert r.status_code == 202, r.text
    assert r.json()["faults_opened"] == 0 and r.json()["decisions"] == []
    (s,) = http.get("/v1/jobs/j1/progress").json()["stalls"]
    assert (s["node"], s["comm_id"], s["rank"], s["seq_number"]) == ("n0", WORLD, 3, 9000)
    assert (s["func"], s["open_s"]) == ("AllReduce", 10.5)
    assert http.get("/v1/jobs/j1").json()["mode"] == "normal"


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"kind": "communicator", "comm_id": 5, "rank": 0}, "nranks"),
        ({"kind": "communicator", "comm_id": 5, "rank": 4, "nranks": 4}, "not below nranks"),
        ({"kind": "communicator", "comm_id": 0, "rank": 0, "nranks": 4}, "comm_id"),
        ({"kind": "communicator", "comm_id": 5, "rank": 0, "nranks": 2**31}, "nranks"),
        ({"kind": "communicator", "comm_id": 5, "rank": 0, "nranks": 4, "job_id": "a b"}, "job_id"),
        ({"kind": "stall", "comm_id": 5, "rank": 0}, "seq_number"),
        ({"kind": "stall", "comm_id": 5, "rank": 0, "seq_number": 2**64}, "seq_number"),
        ({"kind": "stall", "comm_id": 5, "rank": 2**31, "seq_number": 1}, "rank"),
    ],
)
def test_bad_ccl_events_are_refused_whole(
    http: httpx.Client, fields: dict[str, Any], needle: str
) -> None:
    register_nodes(http, ["n0"])
    assert http.post("/v1/jobs", json=job_body("j1", ["n0"])).status_code == 201
    good = announce("n0", 7, 0, 8)
    bad = event("n0", device=None, **fields)
    r = post(http, good, bad)
    assert r.status_code == 422
    assert needle in str(r.json()["detail"])
    assert http.get("/v1/jobs/j1/progress").json()["communicators"] == []


@pytest.mark.parametrize(
    ("ccl", "needle"),
    [
        ({**NCCL, "kind": "rccl"}, "kind"),
        ({**NCCL, "version": "2.29.7-rc1"}, "version"),
        ({**NCCL, "merged_nics": [["mlx5_0", "mlx5_1"], ["mlx5_1"]]}, "two virtual NICs"),
        ({**NCCL, "merge": "rail"}, "merged_nics"),
        ({**NCCL, "merged_nics": [[]]}, "merged_nics"),
        ({**NCCL, "merged_nics": [["bad name"]]}, "merged_nics"),
        ({**NCCL, "fail_back": True}, "fail_back"),
    ],
)
def test_bad_ccl_declarations_are_refused(
    http: httpx.Client, ccl: dict[str, Any], needle: str
) -> None:
    register_nodes(http, ["n0"])
    r = http.post("/v1/jobs", json=job_body("j1", ["n0"], ccl=ccl))
    assert r.status_code == 422
    assert needle in str(r.json()["detail"])
    assert http.get("/v1/jobs/j1").status_code == 404


def _decisions(http: httpx.Client, job: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = http.get(f"/v1/jobs/{job}/decisions").json()["decisions"]
    return out


def test_nccl_failover_domain_changes_the_answer(http: httpx.Client) -> None:
    """50 min into the hour, failing over beats restarting, if anything can fail over."""
    register_nodes(http, ["n0", "n1", "n2", "n3"])
    # The same job twice: on stock NCCL, and (on two other nodes) on Railover's CCL.
    assert http.post("/v1/jobs", json=job_body("nccl", ["n0", "n1"], ccl=NCCL)).status_code == 201
    assert http.post("/v1/jobs", json=job_body("railover", ["n2", "n3"])).status_code == 201

    # One device of the merged pair: NCCL fails over to mlx5_1 by itself.
    r = post(http, event("n0", device="mlx5_0", after_s=3000))
    assert r.status_code == 202, r.text
    (d,) = _decisions(http, "nccl")
    assert d["action"] == "failover"
    assert "NCCL fails over to its healthy partner itself" in d["reason"]
    assert d["plan"]["mitigation"] == "nccl"
    assert d["plan"]["nccl"]["degraded_ranks"] == [0, 1]
    assert d["plan"]["nccl"]["bandwidth_left"] == 0.5
    assert http.get("/v1/jobs/nccl/commands").json()["commands"] == []  # nothing sent to NCCL
    assert http.get("/v1/jobs/nccl").json()["mode"] == "failed_over"

    # A device NCCL merged with nothing: Railover's s-Bond fails it over, stock NCCL cannot.
    post(
        http, event("n1", device="mlx5_2", after_s=3010), event("n2", device="mlx5_2", after_s=3010)
    )
    latest = _decisions(http, "nccl")[0]
    assert latest["action"] == "restart" and "no partner" in latest["reason"]
    assert latest["inputs"]["path_available"] is False
    (s_bond,) = _decisions(http, "railover")
    assert s_bond["action"] == "failover"
    assert "nccl" not in s_bond["plan"]
    kinds = {c["kind"] for c in http.get("/v1/jobs/railover/commands").json()["commands"]}
    assert kinds == {"failover"}

    # The merged pair's other device too: the job is already restarting, so nothing more
    # is decided for its old incarnation.
    post(http, event("n0", device="mlx5_1", after_s=3020))
    assert len(_decisions(http, "nccl")) == 2
    assert http.get("/v1/jobs/nccl").json()["mode"] == "restarting"
    assert http.get("/v1/jobs/nccl/commands").json()["commands"] == []

    # Both devices of a merged pair lost at once: that virtual NIC is gone.
    register_nodes(http, ["n4"])
    assert http.post("/v1/jobs", json=job_body("pair", ["n4"], ccl=NCCL)).status_code == 201
    post(
        http, event("n4", device="mlx5_0", after_s=3000), event("n4", device="mlx5_1", after_s=3000)
    )
    (latest,) = _decisions(http, "pair")
    assert latest["action"] == "restart"
    assert "every device of the virtual NIC is lost" in latest["reason"]
    assert latest["plan"]["nccl"]["fatal_ranks"] == [0, 1]
    assert http.get("/v1/jobs/pair/commands").json()["commands"] == []


def test_nccl_without_port_failover_restarts(http: httpx.Client) -> None:
    register_nodes(http, ["n0"])
    body = job_body("j1", ["n0"], ccl={**NCCL, "port_failover": False})
    assert http.post("/v1/jobs", json=body).status_code == 201
    post(http, event("n0", device="mlx5_0", after_s=3000))
    (d,) = _decisions(http, "j1")
    assert d["action"] == "restart" and "port failover is not active" in d["reason"]
    # A device no rank's virtual NIC holds: nothing for NCCL to do.
    body = job_body("j2", ["n1"], gpus=1, ccl=NCCL)
    register_nodes(http, ["n1"])
    assert http.post("/v1/jobs", json=body).status_code == 201
    post(http, event("n1", device="mlx5_5", after_s=3000))
    assert _decisions(http, "j2") == []
    assert http.get("/v1/jobs/j2").json()["mode"] == "normal"


def test_fail_back_is_nccls_port_recovery_railover_only_records_it(db_url: str) -> None:
    settings = Settings(
        db_url=db_url,
        port=0,
        allow_anonymous_loopback=True,
        failback_damping_s=1.0,
        coordinator_interval_s=0.1,
    )
    with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        register_nodes(http, ["n0", "n1"])
        checkpoint = (datetime.now(UTC) - timedelta(seconds=3000)).isoformat()
        pairs = [["mlx5_2", "mlx5_3"]]
        for job, node, version in (("new", "n0", "2.30.1"), ("old", "n1", "2.29.7")):
            ccl = {**NCCL, "version": version, "merged_nics": pairs}
            body = job_body(job, [node], last_checkpoint_at=checkpoint, ccl=ccl)
            assert http.post("/v1/jobs", json=body).status_code == 201
        t0 = datetime.now(UTC) - timedelta(seconds=5)

        def port(node: str, kind: str, at: datetime) -> dict[str, Any]:
            return {
                "event_id": str(uuid.uuid4()),
                "node": node,
                "kind": kind,
                "device": "mlx5_3",
                "port": 1,
                "observed_at": at.isoformat(),
            }

        post(http, port("n0", "port_down", t0), port("n1", "port_down", t0))
        assert [_decisions(http, j)[0]["action"] for j in ("new", "old")] == ["failover"] * 2
        post(
            http,
            port("n0", "port_up", t0 + timedelta(seconds=3)),
            port("n1", "port_up", t0 + timedelta(seconds=3)),
        )
        assert wait_until(
            lambda: all(_decisions(http, j)[0]["action"] == "failback" for j in ("new", "old")),
            timeout=30,
        ), [_decisions(http, j)[0] for j in ("new", "old")]
        new, old = (_decisions(http, j)[0] for j in ("new", "old"))
        assert "recovers n0/mlx5_3/1 by itself (port recovery)" in new["reason"]
        assert http.get("/v1/jobs/new").json()["mode"] == "normal"
        assert "has no port recovery (2.30+)" in old["reason"]
        assert http.get("/v1/jobs/old").json()["mode"] == "failed_over"
        for job in ("new", "old"):
            assert http.get(f"/v1/jobs/{job}/commands").json()["commands"] == []


def test_a_restart_at_checkpoint_sends_stock_nccl_no_abort(http: httpx.Client) -> None:
    register_nodes(http, ["n0"])
    # The fault is dated a month before the service's clock: a long repair still ahead.
    body = job_body("j1", ["n0"], ccl=NCCL, repair_estimate_s=90 * 86400)
    assert http.post("/v1/jobs", json=body).status_code == 201
    post(http, event("n0", device="mlx5_0", after_s=3000))
    assert _decisions(http, "j1")[0]["action"] == "failover"
    # Degraded until the repair costs more than a reload: restart now.
    r = http.post("/v1/jobs/j1/checkpoints", json={"at": datetime.now(UTC).isoformat()})
    assert r.status_code == 201, r.text
    assert _decisions(http, "j1")[0]["action"] == "restart"
    assert http.get("/v1/jobs/j1").json()["mode"] == "restarting"
    assert http.get("/v1/jobs/j1/commands").json()["commands"] == []
