"""The status snapshot, page and store gauges against the real service on both stores."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime

import httpx
from prometheus_client.parser import text_string_to_metric_families

from railover_testing.cluster_shapes import hgx_node
from railover_testing.local import local_service
from scheduler_svc.config import Settings
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.tokens import TokenRepo
from scheduler_svc.web.render import duration
from tests.deploy.tools import need_tool
from tests.scheduler_svc.helpers import event, register_nodes
from tests.web.scenario import failed_over_cluster


def samples(http: httpx.Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = http.get("/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def waiting_commands(http: httpx.Client) -> int:
    """Commands of every job that no rank has acknowledged yet, from the jobs API."""
    return sum(
        c["state"] in ("issued", "delivered")
        for job in ("job-a", "job-b")
        for c in http.get(f"/v1/jobs/{job}/commands").json()["commands"]
    )


def test_status_shows_grid_jobs_decisions_and_faults(http: httpx.Client) -> None:
    failed_over_cluster(http)
    r = http.get("/v1/status")
    assert r.status_code == 200, r.text
    s = r.json()
    assert s["rails"] == list(range(8))
    grid = {(n["name"], c["rail"]): c for n in s["nodes"] for c in n["rails"]}
    assert len(grid) == 4 * 8
    assert grid[("n3", 5)]["health"] == "fault"
    assert grid[("n3", 5)]["fault_kind"]
    assert grid[("n0", 0)]["health"] == "fault"
    assert sum(c["health"] == "ok" for c in grid.values()) == 30
    jobs = {j["job_id"]: j for j in s["jobs"]}
    assert jobs["job-b"]["mode"] == "failed_over"
    assert jobs["job-b"]["failed_over_since"] is not None
    assert jobs["job-b"]["latest_decision"]["action"] == "failover"
    assert jobs["job-b"]["latest_decision"]["reason"].startswith("fail over:")
    assert jobs["job-a"]["mode"] == "restarting"
    assert jobs["job-a"]["failed_over_since"] is None
    assert jobs["job-a"]["ranks"] == 16
    assert jobs["job-a"]["nodes"] == ["n0", "n1"]
    assert {(f["node"], f["device"]) for f in s["open_faults"]} == {
        ("n3", "mlx5_5"),
        ("n0", "mlx5_0"),
    }
    assert s["decisions_by_action"] == {"failover": 1, "restart": 1}
    # 16 GPUs x (restart 4230 s - failover 3780 s); the restart saved nothing.
    assert s["saved_gpu_seconds"] == 16 * 450
    assert sum(s["commands_unacknowledged"].values()) == waiting_commands(http) > 0

    page = http.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert 'data-job="job-b" data-mode="failed_over"' in page.text
    assert jobs["job-b"]["latest_decision"]["reason"] in page.text
    assert 'data-health="fault"' in page.text
    live = http.get("/status/live")
    assert live.status_code == 200
    assert "<html" not in live.text
    assert 'data-node="n3"' in live.text


def test_store_gauges_follow_the_store(http: httpx.Client) -> None:
    failed_over_cluster(http)
    m = samples(http)

    def labelled(name: str) -> dict[frozenset[tuple[str, str]], float]:
        return {labels: v for (n, labels), v in m.items() if n == name}

    # Ports by rail and health: 4 nodes x 8 rails, under faults n3's mlx5_5 (rail 5) and
    # n0's mlx5_0 (rail 0).
    ports = {
        (dict(k)["rail"], dict(k)["health"]): v for k, v in labelled("railover_rnic_ports").items()
    }
    assert ports == {
        (str(rail), health): (
            {"ok": 3, "down": 0, "fault": 1} if rail in (0, 5) else {"ok": 4, "down": 0, "fault": 0}
        )[health]
        for rail in range(8)
        for health in ("ok", "down", "fault")
    }
    # Only the ports that are not ok have series of their own, and only their nodes.
    assert labelled("railover_rnic_unhealthy") == {
        frozenset(
            {"node": node, "device": device, "port": "1", "rail": rail, "health": "fault"}.items()
        ): 1
        for node, device, rail in (("n3", "mlx5_5", "5"), ("n0", "mlx5_0", "0"))
    }
    assert labelled("railover_node_unhealthy_rnic_ports") == {
        frozenset({"node": "n3"}.items()): 1,
        frozenset({"node": "n0"}.items()): 1,
    }
    assert m[("railover_job_failed_over_seconds", frozenset({"job_id": "job-b"}.items()))] >= 0
    assert m[("railover_job_failed_over_seconds", frozenset({"job_id": "job-a"}.items()))] == 0
    assert (
        m[
            (
                "railover_job_slowdown_ratio",
                frozenset({"job_id": "job-b", "estimate": "measured"}.items()),
            )
        ]
        == 1.5
    )
    assert m[("railover_jobs", frozenset({"mode": "failed_over"}.items()))] == 1
    pending = sum(
        m[("railover_commands_unacknowledged", frozenset({"state": state}.items()))]
        for state in ("issued", "delivered")
    )
    assert pending == waiting_commands(http) > 0
    assert m[("railover_decisions_saved_gpu_seconds", frozenset())] == 16 * 450
    assert m[("railover_open_faults", frozenset())] == 2

    # A deleted job's series go away instead of reporting it failed over forever.
    assert http.delete("/v1/jobs/job-b").status_code == 204
    m = samples(http)
    assert ("railover_job_failed_over_seconds", frozenset({"job_id": "job-b"}.items())) not in m
    assert ("railover_job_failed_over_seconds", frozenset({"job_id": "job-a"}.items())) in m


def test_page_asks_for_a_token_when_the_service_has_tokens(db_url: str) -> None:
    url = db_url
    engine = make_engine(url)
    with make_sessionmaker(engine)() as session:
        _, viewer = TokenRepo(session).create(
            role="viewer", node=None, description="", now=datetime.now(UTC)
        )
        session.commit()
    engine.dispose()
    with (
        local_service(Settings(db_url=url, port=0, allow_anonymous_loopback=True)) as base,
        httpx.Client(base_url=base) as h,
    ):
        page = h.get("/")
        assert page.status_code == 200
        assert 'id="token-prompt" ' in page.text and 'id="token-prompt" hidden' not in page.text
        assert 'data-node="' not in page.text
        assert h.get("/status/live").status_code == 401
        assert h.get("/v1/status").status_code == 401
        auth = {"Authorization": f"Bearer {viewer}"}
        assert h.get("/status/live", headers=auth).status_code == 200
        assert h.get("/v1/status", headers=auth).json()["jobs"] == []
        assert 'id="token-prompt" hidden' in h.get("/", headers=auth).text


def test_durations_read_like_a_person_would_say_them() -> None:
    assert duration(None) == "-"
    assert duration(45) == "45 s"
    assert duration(1500) == "25 min"
    assert duration(3780) == "1.05 h"
    assert duration(4230) == "1.18 h"
    assert duration(30 * 3600) == "30.0 h"
    assert duration(3 * 86400) == "3.0 d"


def test_status_at_scale_sums_by_rail_and_switch_and_pages_the_nodes(http: httpx.Client) -> None:
    """Summaries cover the whole fabric; nodes come a page at a time, filtered by rail,
    switch or health, with only the matching ports."""
    a = [f"n{i:02d}" for i in range(6)]
    b = [f"n{i:02d}" for i in range(6, 12)]
    register_nodes(http, a, switch_name="rail{rail}-a")
    register_nodes(http, b, switch_name="rail{rail}-b")
    for node, device in (
        ("n03", "mlx5_5"),
        ("n04", "mlx5_5"),
        ("n08", "mlx5_5"),
        ("n08", "mlx5_2"),
    ):
        r = http.post("/v1/events", json={"events": [event(node, device=device)]})
        assert r.status_code == 202, r.text
    s = http.get("/v1/status").json()
    assert s["nodes_registered"] == s["nodes_total"] == 12
    assert s["next_after_node"] is None and len(s["nodes"]) == 12
    rails = {r["rail"]: r for r in s["by_rail"]}
    assert sorted(rails) == list(range(8))
    assert rails[5] | {"rail": 0} == {
        "rail": 0,
        "switches": 2,
        "ports": 12,
        "ok": 9,
        "down": 0,
        "fault": 3,
    }
    assert (rails[2]["ok"], rails[2]["fault"]) == (11, 1)
    assert all(rails[r]["ok"] == 12 for r in (0, 1, 3, 4, 6, 7))
    assert s["switches_total"] == 16
    # Only switches with a port not ok, most such ports first, then by name.
    assert [(w["switch"], w["rails"], w["fault"], w["ok"], w["nodes"]) for w in s["switches"]] == [
        ("rail5-a", [5], 2, 4, 6),
        ("rail2-b", [2], 1, 5, 6),
        ("rail5-b", [5], 1, 5, 6),
    ]

    sick = http.get("/v1/status", params={"health": "unhealthy"}).json()
    assert [n["name"] for n in sick["nodes"]] == ["n03", "n04", "n08"]
    assert sick["nodes_total"] == 3
    on_b5 = http.get("/v1/status", params={"switch": "rail5-b"}).json()
    assert [n["name"] for n in on_b5["nodes"]] == b
    assert {(c["device"], c["health"]) for c in on_b5["nodes"][2]["rails"]} == {("mlx5_5", "fault")}
    rail2 = http.get("/v1/status", params={"rail": 2, "health": "unhealthy"}).json()
    assert [(n["name"], [c["rail"] for c in n["rails"]]) for n in rail2["nodes"]] == [("n08", [2])]

    pages, after = [], None
    while True:
        q: dict[str, str | int] = {"limit": 5}
        if after is not None:
            q["after_node"] = after
        page = http.get("/v1/status", params=q).json()
        assert page["nodes_total"] == 12
        pages.append([n["name"] for n in page["nodes"]])
        after = page["next_after_node"]
        if after is None:
            break
    assert pages == [a[:5], a[5:] + b[:4], b[4:]]

    for bad in ({"rail": -1}, {"limit": 0}, {"limit": 2001}, {"health": "sick"}, {"switch": "a b"}):
        r = http.get("/v1/status", params=bad)
        field = f"query.{next(iter(bad))}"
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == field, (bad, r.text)

    page = http.get("/", params={"switch": "rail5-b"}).text
    assert [f"n{i:02d}" for i in range(6, 12)] == [
        n for n in (f"n{i:02d}" for i in range(12)) if f'data-node="{n}"' in page
    ]
    assert 'href="?switch=rail5-b&amp;health=unhealthy"' in page
    assert 'data-switch="rail2-b"' in page and 'href="?switch=rail2-b"' in page
    first = http.get("/", params={"limit": 5}).text
    assert 'id="next-page" href="?after_node=n04&amp;limit=5"' in first


def test_a_port_has_a_series_only_while_it_is_not_ok(http: httpx.Client) -> None:
    """A port registered DOWN (no fault: no job uses it) is counted down and named; once
    the node registers it ACTIVE again its series goes, and the counts follow."""
    body = hgx_node()
    body["rnics"][3]["state"] = "DOWN"
    assert http.put("/v1/nodes/n9", json=body).status_code == 200
    m = samples(http)
    port = {"node": "n9", "device": "mlx5_3", "port": "1", "rail": "3"}
    assert m[("railover_rnic_unhealthy", frozenset((port | {"health": "down"}).items()))] == 1
    assert m[("railover_node_unhealthy_rnic_ports", frozenset({"node": "n9"}.items()))] == 1
    assert m[("railover_rnic_ports", frozenset({"rail": "3", "health": "down"}.items()))] == 1
    assert m[("railover_rnic_ports", frozenset({"rail": "3", "health": "ok"}.items()))] == 0

    body["rnics"][3]["state"] = "ACTIVE"
    assert http.put("/v1/nodes/n9", json=body).status_code == 200
    m = samples(http)
    assert not [
        k for k in m if k[0] in ("railover_rnic_unhealthy", "railover_node_unhealthy_rnic_ports")
    ]
    assert m[("railover_rnic_ports", frozenset({"rail": "3", "health": "down"}.items()))] == 0
    assert m[("railover_rnic_ports", frozenset({"rail": "3", "health": "ok"}.items()))] == 1


def test_decision_latency_is_observed_under_each_decisions_action(http: httpx.Client) -> None:
    def count(action: str) -> float:
        key = ("railover_decision_latency_seconds_count", frozenset({"action": action}.items()))
        return samples(http).get(key, 0.0)

    before = {a: count(a) for a in ("failover", "restart", "none")}
    failed_over_cluster(http)  # one failover decision (job-b), one restart (job-a)
    assert {a: count(a) - before[a] for a in before} == {"failover": 1, "restart": 1, "none": 0}


def test_metrics_pass_promtools_lint(http: httpx.Client) -> None:
    """Names, units, help and types as Prometheus' own linter wants them, on a scrape that
    holds every store gauge (a failed-over job, open faults, waiting commands)."""
    failed_over_cluster(http)
    text = http.get("/metrics").text
    assert "railover_rnic_unhealthy{" in text and "railover_job_slowdown_ratio{" in text
    r = subprocess.run(
        [need_tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
