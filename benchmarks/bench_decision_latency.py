"""Decision latency: a fault posted over HTTP on loopback until its decision is stored.

The service runs as its own process (`railover serve`), as in production; the
client posts one port_down at a time for a job of `--nodes` HGX nodes x 8 GPUs
(1,024 GPUs by default) and times the request, which returns only after the
decision and its commands have committed. Each fault's port comes up again at
once; it fails back after the damping period, after the run.

Faults hit even-numbered RNICs only (mlx5_0 of every node, then mlx5_2, ...). An
HGX node's GPU 2k backs up onto RNIC 2k+1 and GPU 2k+1 onto RNIC 2k, so a failed
even RNIC leaves ranks with only their backup on even rails and ranks with only
their primary on odd ones: no pair across nodes loses both of its paths however
many faults are still damping, and every fault is a failover decision.

    .venv/bin/python -m benchmarks.bench_decision_latency [--faults 300] [--nodes 128]
        [--backend sqlite,postgres]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx

from benchmarks import bench_registration, benchlib


def run(db_url: str, nodes: int, faults: int) -> dict[str, float]:
    # No agent acknowledges commands here: the retries must not give up on a node (and
    # restart the job) mid-run.
    env = {"RAILOVER_COMMAND_ACK_TIMEOUT_S": "86400"}
    served = benchlib.served_process(db_url, env=env)
    with served as (url, _), httpx.Client(base_url=url, timeout=120) as http:
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
        latencies: list[float] = []
        unavailable = 0
        for i in range(faults):
            down = {
                "event_id": str(uuid.uuid4()),
                "node": names[i % nodes],
                "kind": "port_down",
                "device": f"mlx5_{2 * (i // nodes % 4)}",
                "port": 1,
                "observed_at": (checkpoint + timedelta(seconds=2000 + i)).isoformat(),
            }
            started = time.perf_counter()
            r = http.post("/v1/events", json={"events": [down]})
            took = time.perf_counter() - started
            if r.status_code == 503:
                # The store stayed locked past its busy timeout (SQLite, one writer): the
                # fault was not recorded. Counted, and left out of the latencies.
                unavailable += 1
                continue
            latencies.append(took)
            if r.status_code != 202 or len(r.json()["decisions"]) != 1:
                raise RuntimeError(
                    f"fault {i}: expected one decision, got {r.status_code}: {r.text}"
                )
            # Recovered now: fail-back waits out the damping period, after the run.
            up = down | {
                "event_id": str(uuid.uuid4()),
                "kind": "port_up",
                "observed_at": datetime.now(UTC).isoformat(),
            }
            http.post("/v1/events", json={"events": [up]}).raise_for_status()
        stored = http.get("/v1/jobs/bench/decisions", params={"limit": 1000}).json()
        decided = [d for d in stored["decisions"] if d["trigger"].startswith("fault:")]
        if len(decided) != faults - unavailable:
            raise RuntimeError(f"{len(decided)} fault decisions stored for {faults} faults")
    ms = [x * 1000 for x in latencies[10:]]  # the first few warm caches and pools
    return {
        "p50": benchlib.percentile(ms, 50),
        "p90": benchlib.percentile(ms, 90),
        "p99": benchlib.percentile(ms, 99),
        "mean": statistics.fmean(ms),
        "n": len(ms),
        "unavailable": unavailable,
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
    print(
        f"{'backend':10} {'n':>5} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'mean ms':>8} "
        f"{'503s':>5}"
    )
    for backend in args.backend.split(","):
        with benchlib.scratch_store(backend) as url:
            res = run(url, args.nodes, args.faults)
        cells = " ".join(f"{res[k]:>8.1f}" for k in ("p50", "p90", "p99", "mean"))
        print(f"{backend:10} {res['n']:>5} {cells} {res['unavailable']:>5}", flush=True)


if __name__ == "__main__":
    main()
