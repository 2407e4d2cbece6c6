"""The engine alone: one RNIC fault's reconcile, whole-job against the job index (issue 12).

No store and no HTTP: HGX topologies and s-Bond plans are built in memory for
`--nodes` nodes x 8 GPUs, the job's index once, and then `reconcile` is timed for a
link fault on mlx5_0 of one node, whole-job (`reconcile(now, job, fabric, options)`)
and with the index, which must give the same answer.

    .venv/bin/python -m benchmarks.bench_reconcile_engine [--nodes 128,1024,8192] [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta

from benchmarks import benchlib
from scheduler_svc.engine.fabric import Unhealthy
from scheduler_svc.engine.job_routes import index_for
from scheduler_svc.engine.paths import FailedSet, Gpu, NodeTopology, Rnic, plan_node
from scheduler_svc.engine.reconcile import reconcile
from scheduler_svc.engine.state import FabricView, JobState, Mode, Options

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def hgx(name: str) -> NodeTopology:
    """8 GPUs and 8 RNICs, two of each behind each of 4 PCIe switches, rail i on leaf i."""
    gpus = tuple(Gpu(i, f"g{i}", i // 4, f"p{i // 2}", f"rc{i // 2}", True) for i in range(8))
    rnics = tuple(
        Rnic(f"mlx5_{i}", 1, f"r{i}", i // 4, f"p{i // 2}", f"rc{i // 2}", 400.0, f"leaf{i}", i)
        for i in range(8)
    )
    return NodeTopology(name, gpus, rnics)


def run(nodes: int, rounds: int) -> dict[str, float]:
    names = [f"n{i:04d}" for i in range(nodes)]
    topologies = {n: hgx(n) for n in names}
    plans = {n: plan_node(t) for n, t in topologies.items()}
    ranks = tuple((i * 8 + g, n, g) for i, n in enumerate(names) for g in range(8))
    job = JobState("j", Mode.NORMAL, ranks, 3600.0, 600.0, 0.0, 30.0, T0)
    started = time.perf_counter()
    index = index_for(job, FabricView(topologies, plans, FailedSet()))
    build_s = time.perf_counter() - started
    whole, part = [], []
    for i in range(rounds):
        node = names[i % nodes]
        now = T0 + timedelta(minutes=40)
        u = Unhealthy(f"fault:{i}", f"{node}/mlx5_0/1", "link_down", now, "down", node, "mlx5_0", 1)
        fabric = FabricView(
            topologies, plans, FailedSet(links=frozenset({(node, "mlx5_0", 1)})), (u,)
        )
        started = time.perf_counter()
        slow = reconcile(now, job, fabric, Options())
        whole.append(time.perf_counter() - started)
        started = time.perf_counter()
        fast = reconcile(now, job, fabric, Options(), index)
        part.append(time.perf_counter() - started)
        if fast != slow or fast.decision is None:
            raise RuntimeError("the index decided otherwise")
    return {
        "build_s": build_s,
        "whole_ms": statistics.median(whole) * 1000,
        "index_ms": statistics.median(part) * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", default="128,1024,8192")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    m = benchlib.machine()
    print(f"machine: {m['nproc']} cores, {m['cpu']}")
    print(f"{'GPUs':>7} {'index build s':>14} {'whole-job ms':>13} {'index ms':>9} {'ratio':>6}")
    for n in (int(x) for x in args.nodes.split(",")):
        r = run(n, args.rounds)
        ratio = r["whole_ms"] / r["index_ms"]
        print(
            f"{n * 8:>7} {r['build_s']:>14.2f} {r['whole_ms']:>13.1f} {r['index_ms']:>9.2f} "
            f"{ratio:>6.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
