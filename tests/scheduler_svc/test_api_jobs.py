"""Nodes and jobs over real HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import httpx

from railover_testing.local import local_service
from scheduler_svc.config import Settings
from scheduler_svc.store.db import upgrade
from tests.scheduler_svc.helpers import job_body, register_nodes


def test_register_node_returns_backup_plan(http: httpx.Client) -> None:
    register_nodes(http, ["n0"])
    node = http.get("/v1/nodes/n0").json()
    assert node["topology_version"] == 1
    assert [g["backup"] for g in node["backup_plan"]][:2] == ["mlx5_1/1", "mlx5_0/1"]
    assert all(g["rail_disjoint"] for g in node["backup_plan"])
    register_nodes(http, ["n0"])  # same topology again: no new version
    assert http.get("/v1/nodes/n0").json()["topology_version"] == 1
    register_nodes(http, ["n0"], rails=4)
    assert http.get("/v1/nodes/n0").json()["topology_version"] == 2
    assert [n["name"] for n in http.get("/v1/nodes").json()] == ["n0"]


def test_bad_node_body_names_the_field(http: httpx.Client) -> None:
    r = http.put("/v1/nodes/n0", json={"gpus": [{"index": -1, "pci": "x"}], "rnics": []})
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "invalid"
    assert body["fields"][0]["field"] == "gpus.0.index"
    r = http.put("/v1/nodes/n0", json={"gpus": [], "rnics": [], "gpuz": []})
    assert r.json()["fields"][0]["field"] == "gpuz"
    assert http.get("/v1/nodes/n0").status_code == 404


def test_job_lifecycle(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1"])
    r = http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"]))
    assert r.status_code == 201, r.text
    job = http.get("/v1/jobs/j1").json()
    assert job["mode"] == "normal"
    assert len(job["ranks"]) == 16
    assert http.post("/v1/jobs", json=job_body("j1", ["n0", "n1"])).status_code == 409
    r = http.post("/v1/jobs/j1/checkpoints", json={"at": "2026-11-01T13:00:00Z", "iteration": 1200})
    assert r.status_code == 201 and r.json()["current"] is True
    stale = http.post("/v1/jobs/j1/checkpoints", json={"at": "2026-11-01T12:30:00Z"})
    assert stale.json()["current"] is False
    assert http.get("/v1/jobs/j1").json()["last_checkpoint_iteration"] == 1200
    assert http.delete("/v1/jobs/j1").status_code == 204
    assert http.get("/v1/jobs/j1").status_code == 404
    assert http.delete("/v1/jobs/j1").json()["error"] == "not_found"


def test_job_with_missing_gpu_is_refused_whole(http: httpx.Client) -> None:
    register_nodes(http, ["n0"])
    body = job_body("j1", ["n0", "ghost"])
    body["ranks"][3]["gpu"] = 3
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 422
    fields = r.json()["fields"]
    assert any(f["field"] == "ranks.8.node" and "ghost" in f["problem"] for f in fields)
    assert http.get("/v1/jobs/j1").status_code == 404
    assert http.get("/v1/jobs").json() == []
    bad_gpu = job_body("j1", ["n0"], gpus=8)
    bad_gpu["ranks"][7]["gpu"] = 9
    r = http.post("/v1/jobs", json=bad_gpu)
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "ranks.7.gpu"


def test_job_schema_errors(http: httpx.Client) -> None:
    body = job_body("j1", ["n0"])
    body["ranks"][1]["rank"] = 0
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 422 and "rank numbers" in r.json()["fields"][0]["problem"]
    body = job_body("j1", ["n0"], timeout_s=None)
    r = http.post("/v1/jobs", json=body)
    assert "timeout_s" in r.json()["fields"][0]["problem"]
    body = job_body("j1", ["n0"], last_checkpoint_at="2026-11-01T12:00:00")
    r = http.post("/v1/jobs", json=body)
    assert r.json()["fields"][0]["field"] == "last_checkpoint_at"


def test_ib_timeout_derives_timeout(http: httpx.Client) -> None:
    register_nodes(http, ["n0"])
    body = job_body("j1", ["n0"], timeout_s=None, ib_timeout=20, ib_retry_cnt=7)
    assert http.post("/v1/jobs", json=body).status_code == 201
    assert abs(http.get("/v1/jobs/j1").json()["timeout_s"] - 4.096e-6 * 2**20 * 8) < 1e-9


def test_evaluate_is_stateless(http: httpx.Client) -> None:
    q = {
        "checkpoint_interval_s": 3600,
        "t_elapsed_s": 1500,
        "reload_s": 600,
        "k": 1.5,
        "timeout_s": 30,
    }
    r = http.post("/v1/evaluate", json=q)
    assert r.status_code == 200
    assert r.json()["action"] == "failover"
    assert r.json()["inputs"]["threshold_s"] == 1200
    r = http.post("/v1/evaluate", json=q | {"t_elapsed_s": 1000})
    assert r.json()["action"] == "restart"
    r = http.post("/v1/evaluate", json=q | {"k": None, "concurrent_faults": 3})
    assert r.json()["inputs"]["k"] == 1.5 and r.json()["inputs"]["k_source"] == "default"
    r = http.post("/v1/evaluate", json=q | {"k": 0.5})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "k"
    # A what-if has no placement: one replica on the dropped node unless it says how many.
    scaled = q | {"t_elapsed_s": 0, "allow_scaling": True, "dp_size": 8}
    r = http.post("/v1/evaluate", json=scaled)
    assert r.json()["inputs"]["new_dp_size"] == 7
    assert r.json()["costs_s"]["restart_scaled"] == 30 + 600 + 3600 * 8 / 7
    r = http.post("/v1/evaluate", json=scaled | {"new_dp_size": 6})
    assert r.json()["inputs"]["new_dp_size"] == 6
    assert r.json()["costs_s"]["restart_scaled"] == 30 + 600 + 4800.0
    r = http.post("/v1/evaluate", json=scaled | {"new_dp_size": 8})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "new_dp_size"


def test_health(http: httpx.Client) -> None:
    assert http.get("/healthz").json()["status"] == "ok"
    assert http.get("/readyz").json()["detail"]["auth"] == "open"
    metrics = http.get("/metrics").text
    assert "railover_decisions_total" in metrics
    assert "railover_open_faults" in metrics


def test_plans_follow_each_store_not_a_process_wide_cache(tmp_path: Path) -> None:
    # Two stores in one process, each with a node "n0" at topology version 1 but cabled
    # differently: each store's plan must come from its own topology.
    backups = []
    for name, shape in (("a", {}), ("b", {"rails": 4})):
        upgrade(f"sqlite:///{tmp_path / name}.db")
        settings = Settings(
            db_url=f"sqlite:///{tmp_path / name}.db", port=0, allow_anonymous_loopback=True
        )
        with local_service(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
            register_nodes(http, ["n0", "n1"], **shape)
            assert http.post("/v1/jobs", json=job_body("j", ["n0", "n1"])).status_code == 201
            paths = http.get("/v1/jobs/j/paths").json()["ranks"]
            backups.append([r["backup"] for r in paths[:8]])
    assert backups[0][:2] == ["mlx5_1/1", "mlx5_0/1"]  # 8 RNICs: the partner behind the switch
    assert backups[1][:2] == ["mlx5_1/1", "mlx5_1/1"]  # 4 RNICs: two GPUs share each


def test_paths_come_a_page_at_a_time_in_rank_order(http: httpx.Client) -> None:
    register_nodes(http, ["n0", "n1", "n2"])
    assert http.post("/v1/jobs", json=job_body("j", ["n0", "n1", "n2"])).status_code == 201
    whole = http.get("/v1/jobs/j/paths").json()
    assert [r["rank"] for r in whole["ranks"]] == list(range(24))
    assert whole["next_after_rank"] is None
    pages, after = [], -1
    while after is not None:
        page = http.get("/v1/jobs/j/paths", params={"after_rank": after, "limit": 10}).json()
        pages.append([r["rank"] for r in page["ranks"]])
        assert page["total_pairs"] == whole["total_pairs"]  # job-wide figures on every page
        after = page["next_after_rank"]
    assert pages == [list(range(10)), list(range(10, 20)), list(range(20, 24))]
    # Exactly a page left: the page says there is no next one.
    last = http.get("/v1/jobs/j/paths", params={"after_rank": 13, "limit": 10}).json()
    assert [r["rank"] for r in last["ranks"]] == list(range(14, 24))
    assert last["next_after_rank"] is None
    on_n1 = http.get("/v1/jobs/j/paths", params={"node": "n1", "limit": 3}).json()
    assert [(r["rank"], r["node"]) for r in on_n1["ranks"]] == [(8, "n1"), (9, "n1"), (10, "n1")]
    assert on_n1["next_after_rank"] == 10
    r = http.get("/v1/jobs/j/paths", params={"node": "ghost"})
    assert r.status_code == 404 and "ghost" in r.json()["detail"]
    for bad in ({"limit": 0}, {"limit": 8193}, {"after_rank": -2}):
        r = http.get("/v1/jobs/j/paths", params=bad)
        field = f"query.{next(iter(bad))}"
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == field, bad
