"""GPU-hours saved: the demo's summary, the status page, /metrics and the decisions agree."""

from __future__ import annotations

import io
import math
from typing import Any

import httpx
from rich.console import Console

from railover_testing.demo import summary
from scheduler_svc.web.render import gpu_hours
from tests.scheduler_svc.helpers import event, job_body, register_nodes
from tests.web.test_status_page import samples

# No spare node and k = 3 with dp 4 x tp 4: job-c restarts without its faulty node.
SCALED: dict[str, Any] = {
    "dp_size": 4,
    "tp_size": 4,
    "allow_scaling": True,
    "spare_nodes": False,
    "node_replace_s": 7200,
    "slowdown_k": 3.0,
}


def test_one_accounting_of_gpu_hours_saved(http: httpx.Client) -> None:
    register_nodes(http, [f"n{i}" for i in range(6)])
    jobs: tuple[tuple[str, list[str], dict[str, Any]], ...] = (
        ("job-a", ["n0", "n1"], {}),
        ("job-b", ["n2", "n3"], {}),
        ("job-c", ["n4", "n5"], SCALED),
    )
    for job_id, nodes, extra in jobs:
        assert http.post("/v1/jobs", json=job_body(job_id, nodes, **extra)).status_code == 201
    # job-a fails over twice (each fault moves another rank), job-b restarts, job-c
    # restarts without n4: two decisions save GPU time, the restarts none.
    for node, device, after_s in (
        ("n0", "mlx5_0", 3000),
        ("n1", "mlx5_3", 3100),
        ("n2", "mlx5_0", 1000),
        ("n4", "mlx5_0", 100),
    ):
        r = http.post("/v1/events", json={"events": [event(node, device=device, after_s=after_s)]})
        assert r.status_code == 202 and len(r.json()["decisions"]) == 1, r.text
    rows = [
        (job_id, d)
        for job_id in ("job-a", "job-b", "job-c")
        for d in http.get(f"/v1/jobs/{job_id}/decisions").json()["decisions"]
    ]
    saved = {(j, d["trigger"], d["action"]): d["saved_gpu_s"] for j, d in rows}
    # 16 GPUs x (restart 4230 s - failover 30 + 1.5·600 + 600), then x (4230 - 1380).
    assert saved == {
        ("job-a", "fault:1", "failover"): 16 * 2700.0,
        ("job-a", "fault:2", "failover"): 16 * 2850.0,
        ("job-b", "fault:3", "restart"): 0.0,
        ("job-c", "fault:4", "restart_scaled"): 0.0,
    }
    total = 16 * 2700.0 + 16 * 2850.0
    assert math.fsum(saved.values()) == total

    table, summed = summary(rows)
    status = http.get("/v1/status").json()
    metric = samples(http)[("railover_decisions_saved_gpu_seconds", frozenset())]
    assert summed == status["saved_gpu_seconds"] == metric == total
    out = io.StringIO()
    Console(file=out, width=240, color_system=None).print(table)
    assert f"saved vs. always restarting: {gpu_hours(total)}" in out.getvalue()
    assert gpu_hours(total) == "24.7 GPU·h"
    page = http.get("/status/live").text
    assert "<b>24.7 GPU·h</b><span>saved vs. always restarting" in page
