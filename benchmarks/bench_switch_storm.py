"""Switch storms: many nodes report port faults within one second.

The service runs as its own process (`railover serve`). Two scenarios:

- `tor` (the default): 64 nodes x 8 RNIC faults. Every node has an agent
  stand-in: one thread long-polling the node's commands, one posting the node's
  8 port_down events (spread over a second, as eight failing switches would be
  seen); 8 jobs of 64 GPUs. Measured per round: the time from the storm's start
  until every job has its decision, and until each node's poll returned its
  commands (p50/p99 over the 64 nodes).
- `leaf`: one leaf switch of one big job fails. `--nodes` HGX nodes (8,192 by
  default: a 65,536-GPU job) are registered, 64 to a leaf switch per rail; the
  64 nodes under rail 3's first leaf each post one port_down within one second,
  each with its commands long-polled. Measured from the last report's send:
  until every post was answered (each answer follows its decision's commit),
  until the switch failure is listed in GET /v1/fabric, and until the job's
  last command row was written (its `created_at`, read from the store).

    .venv/bin/python -m benchmarks.bench_switch_storm [--rounds 3] [--backend sqlite,postgres]
    .venv/bin/python -m benchmarks.bench_switch_storm --scenario leaf [--nodes 8192]
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx

from benchmarks import bench_registration, benchlib
from railover_testing.cluster_shapes import hgx_node
from railover_testing.processes import store_rows

NODES, RAILS, NODES_PER_JOB = 64, 8, 8
LEAF_SIZE, LEAF_RAIL = 64, 3


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


def leaf_storm(url: str, db_url: str, nodes: int) -> dict[str, float]:
    names = [f"n{i:05d}" for i in range(nodes)]
    checkpoint = datetime.now(UTC) - timedelta(seconds=2400)

    started = time.perf_counter()
    bench_registration.register(
        url, names, lambda i: hgx_node(switch_name=f"leaf{i // LEAF_SIZE}-rail{{rail}}")
    )
    print(f"  {nodes} nodes registered in {time.perf_counter() - started:.1f} s", flush=True)
    with httpx.Client(base_url=url, timeout=600) as http:
        body = benchlib.job_body("big", names, checkpoint)
        http.post("/v1/jobs", json=body).raise_for_status()
    print(f"  job of {nodes * 8} ranks registered", flush=True)
    storm = names[:LEAF_SIZE]
    sent: dict[str, datetime] = {}
    answered: dict[str, datetime] = {}
    got_commands: dict[str, datetime] = {}
    ready = threading.Barrier(len(storm) * 2 + 1)

    def poll(node: str) -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            ready.wait()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                got = c.get(f"/v1/nodes/{node}/commands", params={"wait_s": 20}).json()
                if got["commands"]:
                    got_commands[node] = datetime.now(UTC)
                    return

    def report(i: int, node: str) -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            ready.wait()
            time.sleep(i / len(storm))  # the 64 reports land within the storm's one second
            event = {
                "event_id": str(uuid.uuid4()),
                "node": node,
                "kind": "port_down",
                "device": f"mlx5_{LEAF_RAIL}",
                "port": 1,
                "observed_at": datetime.now(UTC).isoformat(),
            }
            sent[node] = datetime.now(UTC)
            c.post("/v1/events", json={"events": [event]}).raise_for_status()
            answered[node] = datetime.now(UTC)

    threads = [threading.Thread(target=poll, args=(n,)) for n in storm]
    threads += [threading.Thread(target=report, args=(i, n)) for i, n in enumerate(storm)]
    for t in threads:
        t.start()
    ready.wait()
    leaf = f"leaf0-rail{LEAF_RAIL}"
    switch_seen: datetime | None = None
    with httpx.Client(base_url=url, timeout=120) as http:
        deadline = time.monotonic() + 180
        while switch_seen is None and time.monotonic() < deadline:
            fabric = http.get("/v1/fabric").json()
            if any(leaf in str(sf) for sf in fabric["switch_faults"]):
                switch_seen = datetime.now(UTC)
    for t in threads:
        t.join(timeout=180)
    if len(answered) != len(storm):
        raise RuntimeError(f"only {len(answered)} of {len(storm)} posts answered")
    if switch_seen is None:
        raise RuntimeError(f"no switch failure of {leaf} in GET /v1/fabric")
    (last_cmd, n_cmds, n_nodes), *_ = store_rows(
        db_url.replace("postgresql://", "postgresql+psycopg://", 1),
        "SELECT MAX(created_at), COUNT(*), COUNT(DISTINCT node) FROM commands WHERE job_id = 'big'",
    )
    if isinstance(last_cmd, str):
        last_cmd = datetime.fromisoformat(last_cmd)
    if last_cmd.tzinfo is None:
        last_cmd = last_cmd.replace(tzinfo=UTC)
    last_report = max(sent.values())

    def after(t: datetime) -> float:
        return (t - last_report).total_seconds()

    answers = [(answered[n] - sent[n]).total_seconds() for n in storm]
    return {
        "post_p50_s": benchlib.percentile(answers, 50),
        "post_p99_s": benchlib.percentile(answers, 99),
        "all_answered_s": after(max(answered.values())),
        "switch_listed_s": after(switch_seen),
        "last_command_s": after(last_cmd),
        "polls_with_commands": float(len(got_commands)),
        "command_rows": float(n_cmds),
        "command_nodes": float(n_nodes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="sqlite,postgres")
    ap.add_argument("--scenario", choices=("tor", "leaf"), default="tor")
    ap.add_argument("--nodes", type=int, default=8192, help="leaf: nodes of the one job")
    args = ap.parse_args()
    m = benchlib.machine()
    if args.scenario == "leaf":
        print(
            f"machine: {m['nproc']} cores, {m['cpu']}; one job of {args.nodes * 8} GPUs; "
            f"{LEAF_SIZE} nodes lose rail {LEAF_RAIL} (one leaf switch) within 1 s"
        )
        for backend in args.backend.split(","):
            with benchlib.scratch_store(backend) as db_url, benchlib.served(db_url) as url:
                res = leaf_storm(url, db_url, args.nodes)
            print(f"{backend}: " + ", ".join(f"{k} {v:.3f}" for k, v in res.items()), flush=True)
        return
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
