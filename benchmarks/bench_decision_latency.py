"""Decision latency: a fault posted over HTTP on loopback until its decision is stored.

The service runs as its own process (`railover serve`), as in production; the
client posts one port_down at a time for a 1,024-GPU job (128 nodes x 8 GPUs)
and times the request, which returns only after the decision has committed.
Each fault is cleared again so every decision sees one open fault.

    .venv/bin/python benchmarks/bench_decision_latency.py [--faults 300] [--backend sqlite,postgres]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

import bench_registration
import benchlib
import httpx


def run(db_url: str, nodes: int, faults: int) -> dict[str, float]:
    # No damping: a port_up closes its fault at once (and fails back), so every fault
    # meets a job with none open. With damping the faults pile up until two of them
    # break a backup-to-backup pair and the job restarts, deciding nothing after. No
    # agent acknowledges commands here: the retries must not give up on a node mid-run.
    env = {"RAILOVER_FAILBACK_DAMPING_S": "0", "RAILOVER_COMMAND_ACK_TIMEOUT_S": "86400"}
    served = benchlib.served_process(db_url, env=env)
    with served as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        names = [f"n{i:04d}" for i in range(nodes)]
        bench_registration.register(url, names)
        checkpoint = datetime.now(UTC) - timedelta(hours=1)
        job = {
            "job_id": "bench",
            "ranks": [
                {"rank": i * 8 + g, "node": n, "gpu": g}
                for i, n in enumerate(names)
                for g in range(8)
            ],
            "checkpoint_interval_s": 3600,
            "reload_s": 600,
            "detect_s": 0,
            "timeout_s": 30,
            "last_checkpoint_at": checkpoint.isoformat(),
        }
        http.post("/v1/jobs", json=job).raise_for_status()
        latencies = []
        for i in range(faults):
            down = {
                "event_id": str(uuid.uuid4()),
                "node": names[i % nodes],
                "kind": "port_down",
                # A port is hit again only after every port of the job was.
                "device": f"mlx5_{(i + i // nodes) % 8}",
                "port": 1,
                "observed_at": (checkpoint + timedelta(seconds=2000 + i)).isoformat(),
            }
            started = time.perf_counter()
            r = http.post("/v1/events", json={"events": [down]})
            latencies.append(time.perf_counter() - started)
            if r.status_code != 202 or len(r.json()["decisions"]) != 1:
                raise RuntimeError(
                    f"fault {i}: expected one decision, got {r.status_code}: {r.text}"
                )
            # Recovered now: with no damping it fails back at once.
            up = down | {
                "event_id": str(uuid.uuid4()),
                "kind": "port_up",
                "observed_at": datetime.now(UTC).isoformat(),
            }
            back = http.post("/v1/events", json={"events": [up]})
            if back.status_code != 202 or len(back.json()["decisions"]) != 1:
                raise RuntimeError(f"fault {i}: expected a fail-back, got {back.text}")
        stored = http.get("/v1/jobs/bench/decisions", params={"limit": 1000}).json()
        decided = [d for d in stored["decisions"] if d["trigger"].startswith("fault:")]
        if len(decided) != faults:
            raise RuntimeError(f"{len(decided)} fault decisions stored for {faults} faults")
    ms = [x * 1000 for x in latencies[10:]]  # the first few warm caches and pools
    return {
        "p50": benchlib.percentile(ms, 50),
        "p90": benchlib.percentile(ms, 90),
        "p99": benchlib.percentile(ms, 99),
        "mean": statistics.fmean(ms),
        "n": len(ms),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--faults", type=int, default=300)
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--backend", default="sqlite,postgres")
    args = ap.parse_args()
    m = benchlib.machine()
    print(
        f"machine: {m['nproc']} cores, {m['cpu']}; {args.nodes * 8}-GPU job, {args.faults} faults"
    )
    print(f"{'backend':10} {'n':>5} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for backend in args.backend.split(","):
        with benchlib.scratch_store(backend) as url:
            res = run(url, args.nodes, args.faults)
        cells = " ".join(f"{res[k]:>8.1f}" for k in ("p50", "p90", "p99", "mean"))
        print(f"{backend:10} {res['n']:>5} {cells}")


if __name__ == "__main__":
    main()
