"""Run every benchmark once with its default settings (`make bench`); each prints its own table.

    .venv/bin/python -m benchmarks.run_all   # from the repository root

The figures recorded in benchmarks/RESULTS.md come from these commands.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = [
    ["bench_plugin.py"],
    ["bench_nccl_profiler.py"],
    ["bench_decision_latency.py"],
    ["bench_decision_latency.py", "--nodes", "8192", "--faults", "40"],
    ["bench_reconcile_engine.py"],
    ["bench_switch_storm.py"],
    # One leaf of a 65,536-GPU job; and a 2,048-GPU job on both stores.
    ["bench_switch_storm.py", "--scenario", "leaf", "--nodes", "8192", "--backend", "sqlite"],
    ["bench_switch_storm.py", "--scenario", "leaf", "--nodes", "256"],
    ["bench_registration.py"],
    ["bench_hostile_service.py"],
    # Statements and commits per fault report at 1k, 8k and 64k GPUs, beside the floor.
    ["bench_statements.py"],
    # /metrics at 8,192 nodes: series, bytes and scrape time.
    ["bench_metrics.py", "--backend", "sqlite,postgres"],
    # Old path beside new at the agent's default wait; then 8,192 agents at the longest one,
    # long-polling and on streams.
    ["bench_idle_polls.py", "--runs", "old"],
    [
        "bench_idle_polls.py",
        "--runs",
        "sqlite,postgres,stream-sqlite,stream-postgres",
        "--wait-s",
        "120",
        "--samples",
        "50",
    ],
    ["bench_simulate.py"],
    ["bench_twin.py"],
    # The month: 2,048 nodes (16,384 GPUs) at the default fault rates.
    [
        "bench_twin.py",
        "--nodes",
        "2048",
        "--days",
        "30",
        "--fault-scale",
        "1",
        "--policy",
        "railover",
    ],
    # The planner's expected loss beside the twin's realized loss, per policy.
    ["bench_twin_vs_planner.py"],
    ["bench_sequences_model.py", "--minutes", "10"],
    ["bench_agent.py", "--seconds", "60"],
]


def main() -> int:
    failed = []
    for cmd in BENCHMARKS:
        print(f"\n=== {' '.join(cmd)} ===", flush=True)
        module = f"benchmarks.{Path(cmd[0]).stem}"
        rc = subprocess.call([sys.executable, "-m", module, *cmd[1:]], cwd=ROOT)
        if rc != 0:
            failed.append(cmd[0])
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
