"""Simulator benchmark: the vectorised Monte Carlo against a plain per-event Python loop.

Times 10,000 runs of the paper's job (16,384 GPUs, 1925 fault-free hours, all
five policies) with the numpy kernels, and the same model as one Python
iteration per event and run (`simulate_loop`) on fewer runs, extrapolated per
run to 10,000. Prints the machine, its load, both times, the speed-up, and the
reductions the simulation gives on the paper's setup and two variants.
Usage: .venv/bin/python -m benchmarks.bench_simulate [--runs N] [--loop-runs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import replace
from typing import Any

from benchmarks import benchlib
from scheduler_svc.planning.params import JobModel
from scheduler_svc.planning.simulate import POLICIES, simulate, simulate_loop


def machine() -> dict[str, Any]:
    return benchlib.machine() | {
        "python": platform.python_version(),
        "loadavg_1m": os.getloadavg()[0],
    }


def time_vectorised(model: JobModel, runs: int, repeats: int) -> tuple[list[float], Any]:
    times = []
    result = None
    for i in range(repeats):
        started = time.perf_counter()
        result = simulate(model, runs, seed=i)
        times.append(time.perf_counter() - started)
    return times, result


def time_loop(model: JobModel, runs: int) -> dict[str, float]:
    """Seconds per run of the plain loop, per policy."""
    per_run = {}
    for policy in POLICIES:
        started = time.perf_counter()
        simulate_loop(model, runs, seed=1, policy=policy)
        per_run[policy] = (time.perf_counter() - started) / runs
    return per_run


def reductions(model: JobModel, runs: int) -> dict[str, Any]:
    result = simulate(model, runs, seed=42)
    return {
        policy: {
            "mean_extra_gpu_hours": result.stats[policy].mean_extra_gpu_hours,
            **{
                f"{base}_extra_saved": value["extra_gpu_hours"]
                for base, value in result.reductions[policy].items()
            },
        }
        for policy in POLICIES
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--loop-runs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    paper = JobModel()
    before = machine()
    vec_times, _ = time_vectorised(paper, args.runs, args.repeats)
    loop_per_run = time_loop(paper, args.loop_runs)
    after_load = os.getloadavg()[0]
    loop_total = sum(loop_per_run.values()) * args.runs
    vec_median = statistics.median(vec_times)
    studies = {
        "paper": reductions(paper, args.runs),
        "repair_4h": reductions(replace(paper, repair_h=4.0), args.runs),
        "flowcheck": reductions(replace(paper, checkpoint="flowcheck"), args.runs),
    }
    record = {
        "machine": {**before, "loadavg_1m_after": after_load},
        "runs": args.runs,
        "vectorised_s": vec_times,
        "vectorised_median_s": vec_median,
        "loop_runs": args.loop_runs,
        "loop_s_per_run": loop_per_run,
        "loop_extrapolated_s": loop_total,
        "speedup": loop_total / vec_median,
        "studies": studies,
    }
    if args.json:
        print(json.dumps(record, indent=2))
        return
    m = record["machine"]
    print(f"machine: nproc={m['nproc']} cpu={m['cpu']!r} python {m['python']}")
    print(f"load average (1 min): {m['loadavg_1m']:.2f} before, {after_load:.2f} after")
    print(
        f"vectorised, {args.runs:,} runs x {len(POLICIES)} policies: "
        + ", ".join(f"{t:.2f}" for t in vec_times)
        + f" s (median {vec_median:.2f} s)"
    )
    print(
        f"plain per-event loop, {args.loop_runs:,} runs per policy, "
        f"extrapolated to {args.runs:,}: {loop_total:.1f} s"
    )
    for policy, per_run in loop_per_run.items():
        print(f"  {policy:<16} {per_run * 1e3:8.3f} ms per run")
    print(f"speed-up: {record['speedup']:.0f}x")
    for name, study in studies.items():
        print(f"\n{name}: mean extra GPU-hours and share of the waste saved")
        for policy, row in study.items():
            saved = ", ".join(
                f"{key.removesuffix('_extra_saved')} {value:.1%}"
                for key, value in row.items()
                if key.endswith("_extra_saved")
            )
            print(f"  {policy:<16} {row['mean_extra_gpu_hours']:>12,.0f}  {saved}")


if __name__ == "__main__":
    main()
