"""Faults in, decisions out: the contract cases of the service-core issue."""

from __future__ import annotations

import httpx

from tests.scheduler_svc.helpers import event, job_body, register_nodes


def _setup(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1"])
    assert http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"])).status_code == 201


def test_early_fault_restarts_late_fault_fails_over(http: httpx.Client) -> None:
    _setup(http)
    r = http.post("/v1/events", json={"events": [event("n0", after_s=1000)]})
    assert r.status_code == 202
    assert r.json()["accepted"] == 1 and len(r.json()["decisions"]) == 1
    d = http.get("/v1/jobs/j1/decisions").json()["decisions"][0]
    assert d["action"] == "restart"
    assert d["inputs"]["threshold_s"] == 1200
    assert d["inputs"]["t_elapsed_s"] == 1000
    assert d["inputs"]["k"] == 1.5 and d["inputs"]["k_source"] == "measured"
    assert d["costs_s"]["restart"] == 30 + 600 + 3600
    assert http.get("/v1/jobs/j1").json()["mode"] == "restarting"
    cmds = http.get("/v1/jobs/j1/commands").json()["commands"]
    assert {c["node"] for c in cmds} == {"n0", "n1"} and {c["kind"] for c in cmds} == {"abort"}

    # The port comes back; the job restarted and reported a new checkpoint.
    http.post("/v1/events", json={"events": [event("n0", "port_up", after_s=1100)]})
    # A checkpoint dated before the restart decision is the aborted incarnation's: it
    # changes nothing. The restarted job's, naming its incarnation, ends "restarting".
    r = http.post("/v1/jobs/j1/checkpoints", json={"at": "2026-11-01T12:00:00Z"})
    assert (r.status_code, r.json()["current"]) == (201, False)
    assert http.get("/v1/jobs/j1").json()["mode"] == "restarting"
    r = http.post("/v1/jobs/j1/checkpoints", json={"at": "2026-11-01T12:00:00Z", "incarnation": 2})
    assert r.status_code == 201, r.text
    job = http.get("/v1/jobs/j1").json()
    assert (job["mode"], job["incarnation"]) == ("normal", 2)
    r = http.post("/v1/events", json={"events": [event("n1", device="mlx5_3", after_s=1500)]})
    decisions = http.get("/v1/jobs/j1/decisions").json()["decisions"]
    assert [x["action"] for x in decisions] == ["failover", "restart"]
    latest = decisions[0]
    assert latest["inputs"]["t_elapsed_s"] == 1500
    assert latest["plan"]["failed_over"] == [
        {"rank": 11, "node": "n1", "gpu": 3, "from": "mlx5_3/1", "to": "mlx5_2/1"}
    ]
    paths = http.get("/v1/jobs/j1/paths").json()
    assert paths["failed_over_ranks"] == [11]
    assert paths["ranks"][11]["active"] == "mlx5_2/1"


def test_primary_and_backup_lost_is_restart(http: httpx.Client) -> None:
    _setup(http)
    batch = [
        event("n0", "device_fatal", "mlx5_0", after_s=3000),
        event("n0", "port_down", "mlx5_1", after_s=3001),
    ]
    r = http.post("/v1/events", json={"events": batch})
    assert r.json()["faults_opened"] == 2
    # One batch, one decision per job over everything it reported.
    (decision,) = http.get("/v1/jobs/j1/decisions").json()["decisions"]
    assert decision["action"] == "restart"
    assert "no usable path" in decision["reason"]
    assert decision["inputs"]["path_available"] is False
    # Reported one at a time, the first fault alone is survivable.
    register_nodes(http, ["n2", "n3"])
    http.post("/v1/jobs", json=job_body("j2", ["n2", "n3"]))
    for e in (
        event("n2", "device_fatal", "mlx5_0", after_s=3000),
        event("n2", "port_down", "mlx5_1", after_s=3001),
    ):
        http.post("/v1/events", json={"events": [e]})
    history = http.get("/v1/jobs/j2/decisions").json()["decisions"]
    assert [d["action"] for d in history] == ["restart", "failover"]


def test_flap_reported_with_its_recovery_needs_nothing(http: httpx.Client) -> None:
    _setup(http)
    # Down and up again long before now: damped and healed, the outcome never changed.
    batch = [event("n0", "port_down", after_s=2000), event("n0", "port_up", after_s=2001)]
    r = http.post("/v1/events", json={"events": batch}).json()
    assert (r["faults_opened"], r["decisions"]) == (1, [])
    assert http.get("/v1/jobs/j1/decisions").json()["decisions"] == []
    assert http.get("/v1/jobs/j1/commands").json()["commands"] == []
    (fault,) = http.get("/v1/faults").json()["faults"]
    assert fault["resolved_at"] is not None and "up and quiet" in fault["resolved_reason"]


def test_same_event_twice_is_one_fault_one_decision(http: httpx.Client) -> None:
    _setup(http)
    e = event("n0", after_s=2000)
    first = http.post("/v1/events", json={"events": [e]}).json()
    again = http.post("/v1/events", json={"events": [e]}).json()
    assert (first["accepted"], first["duplicates"]) == (1, 0)
    assert (again["accepted"], again["duplicates"]) == (0, 1)
    dup_in_batch = http.post("/v1/events", json={"events": [e, e]}).json()
    assert dup_in_batch["duplicates"] == 2
    # A different report of the same broken port adds no fault either.
    other = http.post(
        "/v1/events", json={"events": [event("n0", "cqe_error", wc_status=12, after_s=2001)]}
    )
    assert other.json() == {"accepted": 1, "duplicates": 0, "faults_opened": 0, "decisions": []}
    assert len(http.get("/v1/jobs/j1/decisions").json()["decisions"]) == 1


def test_harmless_events_decide_nothing(http: httpx.Client) -> None:
    _setup(http)
    batch = [
        event("n0", "cqe_error", wc_status=5, after_s=10),  # WR_FLUSH_ERR follows other errors
        event("n0", "counter", counter="symbol_error", delta=3, after_s=11),
        event("n0", "progress", device=None, comm_id=7, rank=0, ops_done=100, after_s=12),
    ]
    r = http.post("/v1/events", json={"events": batch}).json()
    assert r["accepted"] == 3 and r["faults_opened"] == 0
    assert http.get("/v1/jobs/j1/decisions").json()["decisions"] == []


def test_fault_on_backup_only_needs_no_action(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1"])
    ranks_on_even_gpus = job_body("j1", ["n0", "n1"])
    ranks_on_even_gpus["ranks"] = [
        {"rank": i, "node": n, "gpu": g}
        for i, (n, g) in enumerate((n, g) for n in ("n0", "n1") for g in (0, 2))
    ]
    assert http.post("/v1/jobs", json=ranks_on_even_gpus).status_code == 201
    http.post("/v1/events", json={"events": [event("n0", device="mlx5_1", after_s=100)]})
    # Only backup redundancy is lost: no rank moves, so the outcome did not change.
    assert http.get("/v1/jobs/j1/decisions").json()["decisions"] == []
    paths = http.get("/v1/jobs/j1/paths").json()
    assert paths["ranks"][0]["backup_ok"] is False and paths["ranks"][0]["active"] == "mlx5_0/1"


def test_bad_events_change_nothing(http: httpx.Client) -> None:
    _setup(http)
    good = event("n0", after_s=2000)
    r = http.post("/v1/events", json={"events": [good, event("n0", "cqe_error", after_s=1)]})
    assert r.status_code == 422
    assert r.json()["fields"][0]["field"] == "events.1.wc_status"
    assert r.json()["fields"][0]["problem"] == "Field required"
    r = http.post("/v1/events", json={"events": [good, event("n9")]})
    assert r.status_code == 404 and "n9" in r.json()["detail"]
    assert http.get("/v1/jobs/j1/decisions").json()["decisions"] == []
    # The good event was not stored by the refused requests: it is new now.
    assert http.post("/v1/events", json={"events": [good]}).json()["accepted"] == 1


def test_k_from_bandwidth_model_and_defaults(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1", "n2", "n3"])
    http.post("/v1/jobs", json=job_body("modelled", ["n0", "n1"], slowdown_k=None, comm_share=0.4))
    # On GPUs of its own (a GPU has one running job), under the same fault.
    http.post("/v1/jobs", json=job_body("default", ["n2", "n3"], slowdown_k=None))
    http.post("/v1/events", json={"events": [event("n0", after_s=3000), event("n2", after_s=3000)]})
    modelled = http.get("/v1/jobs/modelled/decisions").json()["decisions"][0]
    # The backup now carries two GPUs: half the bandwidth, communication 40 % of a step.
    assert modelled["inputs"]["k_source"] == "model"
    assert modelled["inputs"]["k"] == 0.6 + 0.4 / 0.5
    assert modelled["plan"]["bandwidth_left"] == 0.5
    default = http.get("/v1/jobs/default/decisions").json()["decisions"][0]
    assert (default["inputs"]["k"], default["inputs"]["k_source"]) == (1.03, "default")
    assert default["inputs"]["concurrent_faults"] == 1
