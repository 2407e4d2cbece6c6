"""ToR-switch storm: 64 nodes x 8 RNIC faults within one second.

The service runs as its own process (`railover serve`). Every node has an
agent stand-in: one thread long-polling the node's commands, one posting the
node's 8 port_down events (spread over a second, as eight failing switches
would be seen). Measured per round: the time from the storm's start until
every job has its decision, and until each node's poll returned its
commands (p50/p99 over the 64 nodes).

    .venv/bin/python benchmarks/bench_switch_storm.py [--rounds 3] [--backend sqlite,postgres]
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import benchlib
import httpx

from railover_testing.cluster_shapes import hgx_node

NODES, RAILS, NODES_PER_JOB = 64, 8, 8


def one_round(url: str, round_no: int) -> dict[str, float]:
    names = [f"r{round_no}-n{i:02d}" for i in range(NODES)]
    checkpoint = datetime.now(UTC) - timedelta(seconds=2400)
    with httpx.Client(base_url=url, timeout=60) as http:
        for n in names:
            body = hgx_node(switch_name=f"r{round_no}-rail{{rail}}")
            http.put(f"/v1/nodes/{n}", json=body).raise_for_status()
        jobs = []
        for j in range(NODES // NODES_PER_JOB):
            members = names[j * NODES_PER_JOB : (j + 1) * NODES_PER_JOB]
            job_id = f"r{round_no}-job{j}"
            http.post(
                "/v1/jobs", json=benchlib.job_body(job_id, members, checkpoint)
            ).raise_for_status()
            jobs.append(job_id)
    got_commands: dict[str, float] = {}
    posted: dict[str, float] = {}
    ready = threading.Barrier(NODES * 2 + 1)
    t0_box: list[float] = []

    def poll(node: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            ready.wait()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                cmds = c.get(f"/v1/nodes/{node}/commands", params={"wait_s": 10}).json()["commands"]
                if cmds:
                    got_commands[node] = time.perf_counter()
                    return

    def report(i: int, node: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            ready.wait()
            # The eight faults of a node land within the storm's one second.
            time.sleep((i % NODES) / NODES)
            at = datetime.now(UTC)
            events = [
                {
                    "event_id": str(uuid.uuid4()),
                    "node": node,
                    "kind": "port_down",
                    "device": f"mlx5_{d}",
                    "port": 1,
                    "observed_at": (at + timedelta(milliseconds=d)).isoformat(),
                }
                for d in range(RAILS)
            ]
            c.post("/v1/events", json={"events": events}).raise_for_status()
            posted[node] = time.perf_counter()

    threads = [threading.Thread(target=poll, args=(n,)) for n in names]
    threads += [threading.Thread(target=report, args=(i, n)) for i, n in enumerate(names)]
    for t in threads:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    t0_box.append(t0)
    for t in threads:
        t.join(timeout=120)
    with httpx.Client(base_url=url, timeout=60) as http:
        for job in jobs:
            if not http.get(f"/v1/jobs/{job}/decisions").json()["decisions"]:
                raise RuntimeError(f"{job} has no decision")
    cmd_latency = [got_commands[n] - t0 for n in names if n in got_commands]
    if len(cmd_latency) != NODES:
        raise RuntimeError(f"only {len(cmd_latency)} of {NODES} nodes got commands")
    return {
        "all_decided_s": max(posted.values()) - t0,
        "commands_p50_s": benchlib.percentile(cmd_latency, 50),
        "commands_p99_s": benchlib.percentile(cmd_latency, 99),
        "all_commands_s": max(cmd_latency),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="sqlite,postgres")
    args = ap.parse_args()
    m = benchlib.machine()
    print(
        f"machine: {m['nproc']} cores, {m['cpu']}; {NODES} nodes x {RAILS} RNIC faults in 1 s; "
        f"{NODES // NODES_PER_JOB} jobs of {NODES_PER_JOB * 8} GPUs"
    )
    heads = ("decided s", "cmd p50 s", "cmd p99 s", "all cmd s")
    print(f"{'backend':9} {'round':>5} " + " ".join(f"{h:>10}" for h in heads))
    keys = ("all_decided_s", "commands_p50_s", "commands_p99_s", "all_commands_s")
    for backend in args.backend.split(","):
        with benchlib.scratch_store(backend) as db_url, benchlib.served(db_url) as url:
            for r in range(args.rounds):
                res = one_round(url, r)
                print(f"{backend:9} {r:>5} " + " ".join(f"{res[k]:>10.2f}" for k in keys))


if __name__ == "__main__":
    main()
