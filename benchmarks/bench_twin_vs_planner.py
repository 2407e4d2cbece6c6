"""The planner checked against the service: for the same parameters, the share of GPU-time
`railover simulate` expects each policy to lose and the share the fleet twin loses running
the real service.

    .venv/bin/python -m benchmarks.bench_twin_vs_planner \
        [--nodes 20] [--spares 4] [--days 30] [--seeds 12] [--fault-scale 300]

What is compared, so that both sides model the same thing:
- one job on every non-spare node, periodic checkpoints, the planning parameters'
  detection, reload, timeout and k;
- link faults only (port down, repaired after an exponential time of mean repair_h), at
  the planning link rate times --fault-scale. The planner's other assumptions (a fault
  in the backup path of a failed-over GPU is rare, no faults while the job is down, a hot
  spare for every restart) hold for this trace; leaf, GPU and node faults, flaps and
  partitions do not appear in the planner and are left out here;
- the share of the job's GPU-time lost: the planner's mean extra over mean total
  GPU-hours for a job whose work is the twin's simulated time; the twin's lost over
  elapsed GPU-hours, per seed, with a 95 % interval over seeds.

Policies compared: restart-only with the planner's `restart`, railover with its
`railover`. The twin's nccl-failover-only and failover-always have no planner policy
(the planner's `failover` is ReCCL's rule, which no service policy is).

Prints a row per policy: both shares, their ratio and whether the twin's interval holds
the planner's figure within 10 %. The figures go in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import time
from dataclasses import replace

from benchmarks import benchlib
from scheduler_svc.engine.decision import Policy
from scheduler_svc.planning.fit import monthly_fraction
from scheduler_svc.planning.params import JobModel
from scheduler_svc.planning.simulate import simulate
from scheduler_svc.twin.cluster import GPUS, ClusterSpec, FaultKind, trace
from scheduler_svc.twin.loop import Twin

PAIRS = {Policy.RESTART_ONLY: "restart", Policy.RAILOVER: "railover"}


def twin_shares(
    spec: ClusterSpec, model: JobModel, policy: Policy, *, days: float, seeds: int, scale: float
) -> tuple[list[float], int, float, int]:
    """The twin's lost share per seed, faults in the traces, wall seconds, violations."""
    links_only: dict[FaultKind, float] = {k: 0.0 for k in FaultKind if k != FaultKind.LINK}
    shares, faults, wall, violations = [], 0, 0.0, 0
    for seed in range(1, seeds + 1):
        trace_ = trace(spec, model, days, seed, scale, per_component_h=links_only)
        r = Twin(spec, days=days, seed=seed, fault_scale=scale, policy=policy, model=model,
                 faults=trace_).run()  # fmt: skip
        shares.append(r.gpu_hours_total / r.gpu_hours)
        faults += len(trace_)
        wall += r.wall_s
        violations += sum(r.violations.values())
    return shares, faults, wall, violations


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--spares", type=int, default=4)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--fault-scale", type=float, default=300.0)
    ap.add_argument("--runs", type=int, default=20000, help="planner Monte Carlo runs")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    m = benchlib.machine()
    print(f"machine: {m['nproc']} cores, {m['cpu']}")
    spec = ClusterSpec(args.nodes, args.spares, nodes_per_leaf=args.nodes, jobs=1)
    model = JobModel()
    job_gpus = (args.nodes - args.spares) * GPUS
    planner_model = replace(
        model,
        gpus=job_gpus,
        hours=args.days * 24,
        # The monthly probability whose hourly hazard is the twin's: the link rate times
        # the scale.
        link_failure_monthly=monthly_fraction(model.link_rate_per_h * args.fault_scale),
        switch_failure_monthly=0.0,
    )
    print(
        f"one job of {job_gpus} GPUs on {args.nodes - args.spares} nodes ({args.spares} spares), "
        f"{args.days:g} days, link faults only at {args.fault_scale:g}x "
        f"({planner_model.fault_rate_per_h * 24:.3f} a day on the job), {args.seeds} seeds; "
        f"planner {args.runs:,} runs"
    )
    started = time.perf_counter()
    planned = simulate(planner_model, args.runs, seed=1, policies=list(PAIRS.values()))
    print(f"planner: {time.perf_counter() - started:.1f} s")
    for policy, name in PAIRS.items():
        st = planned.stats[name]
        expected = st.mean_extra_gpu_hours / st.mean_gpu_hours
        shares, faults, wall, violations = twin_shares(
            spec, model, policy, days=args.days, seeds=args.seeds, scale=args.fault_scale
        )
        mean = statistics.fmean(shares)
        half = 1.96 * statistics.stdev(shares) / math.sqrt(len(shares)) if len(shares) > 1 else 0
        ratio = mean / expected if expected else math.nan
        holds = abs(mean - expected) <= half + 0.10 * expected
        print(
            f"{policy.value:>12} vs planner {name:<8}: planner {100 * expected:.2f} %, "
            f"twin {100 * mean:.2f} ± {100 * half:.2f} % ({faults} link faults in the traces, "
            f"{violations} violations, {wall:.0f} s); twin/planner {ratio:.3f}; "
            f"{'within' if holds else 'NOT within'} 10 % (allowing the twin's interval)"
        )


if __name__ == "__main__":
    main()
