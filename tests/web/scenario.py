"""A small cluster with one failed-over job and one restarting job, over the real API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests.scheduler_svc.helpers import event, job_body, register_nodes

NODES = ["n0", "n1", "n2", "n3"]


def fault(node: str, device: str, at: datetime) -> dict[str, Any]:
    """A POST /v1/events body: one port-down event observed at ``at``."""
    return {"events": [event(node, device=device, observed_at=at.isoformat())]}


def failed_over_cluster(http: httpx.Client) -> datetime:
    """job-b fails over (fault 1500 s into its interval), job-a restarts (1000 s in).

    At k = 1.5 and T_detect = 0 the threshold is a third of the 3600 s interval.
    The checkpoint was an hour ago, so the page reads like a live cluster's;
    returns its time.
    """
    checkpoint = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    register_nodes(http, NODES)
    for job_id, nodes in (("job-a", NODES[:2]), ("job-b", NODES[2:])):
        body = job_body(job_id, nodes, last_checkpoint_at=checkpoint.isoformat())
        r = http.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
    for node, device, after_s in (("n3", "mlx5_5", 1500), ("n0", "mlx5_0", 1000)):
        r = http.post(
            "/v1/events", json=fault(node, device, checkpoint + timedelta(seconds=after_s))
        )
        assert r.status_code == 202, r.text
        assert r.json()["decisions"], r.text
    return checkpoint
