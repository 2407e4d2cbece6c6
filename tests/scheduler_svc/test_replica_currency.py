"""A replica decides on the store as the other replica left it, whatever it has cached.

Each replica keeps, in its own process, a job's placement and engine index (by placement)
and each node's s-Bond plan (by topology version). Two `railover serve` processes on one
PostgreSQL: B writes (the job's next incarnation elsewhere, a fault, a node cabled anew)
after A has cached what B changes, and A's next decision must be the one the store as B
left it gives: no decision for a node the job left, a restart when B's fault and A's
together leave a GPU no path, the backup of the node as registered now.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from railover_testing.cluster_shapes import hgx_node
from railover_testing.processes import Service
from tests.conftest import truncate_pg
from tests.scheduler_svc.helpers import event, job_body

# Each fault decides for its own node's jobs: no two look like a switch failing.
ENV = {"RAILOVER_CORRELATION_MIN_NODES": "1000"}


def report(url: str, node: str, device: str, after_s: float) -> list[dict[str, Any]]:
    """One port down, reported to `url`; the decisions it caused."""
    r = httpx.post(
        f"{url}/v1/events", json={"events": [event(node, device=device, after_s=after_s)]}
    )
    assert r.status_code == 202, r.text
    ids = r.json()["decisions"]
    stored = httpx.get(f"{url}/v1/jobs/j/decisions", params={"limit": 1000}).json()["decisions"]
    return [d for d in stored if d["decision_id"] in ids]


def moved(decision: dict[str, Any]) -> dict[int, str]:
    """Rank -> the RNIC port a failover moves it onto."""
    return {m["rank"]: m["to"] for m in decision["plan"]["failed_over"]}


def recabled() -> dict[str, Any]:
    """An HGX node with mlx5_1 and mlx5_3 swapped between their PCIe switches: GPUs 2 and 3
    share theirs with mlx5_1 and mlx5_2 now, so mlx5_2 serves GPU 3 and mlx5_1 is its
    backup (as first registered, mlx5_2 served GPU 2, with mlx5_3 as its backup)."""
    body = hgx_node()
    one, three = body["rnics"][1], body["rnics"][3]
    for key in ("pcie_switch", "root_complex", "numa"):
        one[key], three[key] = three[key], one[key]
    return body


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_a_replica_decides_on_what_the_other_wrote(pg_url: str, tmp_path: Path) -> None:
    truncate_pg(pg_url)
    a = Service(pg_url, tmp_path, env=ENV).start()
    b = Service(pg_url, tmp_path, env=ENV).start()
    try:
        with httpx.Client(base_url=a.url, timeout=30) as http:
            for n in ("n0", "n1", "n2", "n3"):
                assert http.put(f"/v1/nodes/{n}", json=hgx_node()).status_code == 200
            assert http.post("/v1/jobs", json=job_body("j", ["n0", "n1"])).status_code == 201
        # A caches the job's placement and index, and n0's and n1's plans.
        (first,) = report(a.url, "n0", "mlx5_4", after_s=2000)
        assert first["action"] == "failover" and moved(first) == {4: "mlx5_5/1"}

        # B places the job's next incarnation on n2 and n3.
        again = job_body("j", ["n2", "n3"], incarnation=2)
        assert httpx.post(f"{b.url}/v1/jobs", json=again).status_code == 201
        # B registers n2 cabled anew (A planned it as A registered it).
        assert httpx.put(f"{b.url}/v1/nodes/n2", json=recabled()).status_code == 200
        # A hears of a fault on n1, which the job left, and one on n2, where it is now.
        assert report(a.url, "n1", "mlx5_0", after_s=2010) == []
        (there,) = report(a.url, "n2", "mlx5_2", after_s=2020)
        assert there["action"] == "failover" and moved(there) == {3: "mlx5_1/1"}

        # B sees n3's mlx5_6 go and moves rank 14 onto mlx5_7, rank 3 staying where A
        # moved it; A then sees mlx5_7 go: GPUs 6 and 7 of n3 have no path left.
        (b_move,) = report(b.url, "n3", "mlx5_6", after_s=2030)
        assert b_move["action"] == "failover"
        assert moved(b_move) == {3: "mlx5_1/1", 14: "mlx5_7/1"}
        (last,) = report(a.url, "n3", "mlx5_7", after_s=2040)
        assert last["action"] in ("restart", "restart_scaled"), last["reason"]
    finally:
        a.stop()
        b.stop()
