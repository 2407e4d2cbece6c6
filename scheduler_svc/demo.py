"""`railover demo`: the service on SQLite, a small cluster, two faults and what was decided.

Job A loses an RNIC 1000 s after its checkpoint, before the failover threshold
(1200 s at k = 1.5, T_detect = 0), so restarting is cheaper. Job B loses one
1500 s in, past the threshold, so it fails over to its backup RNIC.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from scheduler_svc.cluster_shapes import hgx_node
from scheduler_svc.config import Settings
from scheduler_svc.local import local_service

INTERVAL_S = 3600.0


def _job(job_id: str, nodes: list[str], checkpoint: datetime) -> dict[str, Any]:
    ranks = [
        {"rank": i * 8 + g, "node": n, "gpu": g} for i, n in enumerate(nodes) for g in range(8)
    ]
    return {
        "job_id": job_id,
        "ranks": ranks,
        "checkpoint_interval_s": INTERVAL_S,
        "reload_s": 600,
        "detect_s": 0,
        "timeout_s": 30,
        "last_checkpoint_at": checkpoint.isoformat(),
        "slowdown_k": 1.5,
        "dp_size": len(ranks),
    }


def _fault(node: str, device: str, at: datetime) -> dict[str, Any]:
    return {
        "events": [
            {
                "event_id": str(uuid.uuid4()),
                "node": node,
                "kind": "port_down",
                "device": device,
                "port": 1,
                "observed_at": at.isoformat(),
            }
        ]
    }


def run_demo(keep_running: bool = False, console: Console | None = None) -> int:
    console = console or Console()
    with tempfile.TemporaryDirectory(prefix="railover-demo-") as tmp:
        db = Path(tmp) / "railover.db"
        settings = Settings(db_url=f"sqlite:///{db}", port=0)
        console.rule("[bold]Railover demo")
        console.print(f"store: {db}")
        with local_service(settings) as url, httpx.Client(base_url=url, timeout=10) as http:
            console.print(f"service: {url}  (OpenAPI at {url}/docs)")
            for n in ("n0", "n1", "n2", "n3"):
                http.put(f"/v1/nodes/{n}", json=hgx_node()).raise_for_status()
            console.print("registered 4 nodes: 8 GPUs and 8 x 400G RNICs each, rails 0-7")
            checkpoint = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
            scenarios = [
                ("job-a", ["n0", "n1"], "n0", "mlx5_0", 1000.0),
                ("job-b", ["n2", "n3"], "n3", "mlx5_5", 1500.0),
            ]
            for job_id, nodes, *_ in scenarios:
                http.post("/v1/jobs", json=_job(job_id, nodes, checkpoint)).raise_for_status()
                console.print(
                    f"registered {job_id}: 16 ranks on {', '.join(nodes)}, checkpoint every "
                    f"{INTERVAL_S:.0f} s, measured k 1.5"
                )
            table = Table(title="Decisions", show_lines=True)
            for col in ("job", "fault", "t_elapsed", "threshold", "action", "reason"):
                table.add_column(col, overflow="fold")
            for job_id, _nodes, node, dev, after in scenarios:
                at = checkpoint + timedelta(seconds=after)
                started = time.perf_counter()
                r = http.post("/v1/events", json=_fault(node, dev, at))
                r.raise_for_status()
                took_ms = (time.perf_counter() - started) * 1000
                d = http.get(f"/v1/jobs/{job_id}/decisions").json()["decisions"][0]
                console.print(
                    f"fault: {node}/{dev} port 1 down, {after:.0f} s after {job_id}'s checkpoint "
                    f"-> [bold]{d['action']}[/] (decided in {took_ms:.0f} ms)"
                )
                table.add_row(
                    job_id,
                    f"{node}/{dev}",
                    f"{d['inputs']['t_elapsed_s']:.0f} s",
                    f"{d['inputs']['threshold_s']:.0f} s",
                    d["action"],
                    d["reason"],
                )
            console.print(table)
            paths = http.get("/v1/jobs/job-b/paths").json()
            moved = [r for r in paths["ranks"] if r["active"] != r["primary"]]
            for r in moved:
                console.print(
                    f"job-b rank {r['rank']} ({r['node']} GPU {r['gpu']}) now runs on "
                    f"{r['active']} (rail switch {r['backup_switch']}) instead of {r['primary']}"
                )
            if keep_running:
                console.print(f"service left running at {url}; Ctrl-C to stop")
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    pass
        console.rule("done")
    return 0
