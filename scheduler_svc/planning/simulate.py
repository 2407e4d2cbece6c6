"""Monte Carlo of one training job under last-hop network faults, five policies side by side.

The model (hours throughout; every policy sees the same fault process)
----------------------------------------------------------------------
* The job needs W = ``--hours`` of fault-free work on G GPUs. Progress is
  checkpointed every T_interval of *work* (``--checkpoint-interval-h``), or
  after every iteration (``--iteration-s``) with ``--checkpoint flowcheck``,
  which then holds for every policy: the checkpoint regime belongs to the job.
  Checkpoint writing is part of the fault-free hours.
* Faults arrive as a Poisson process in wall-clock time while the job runs,
  at rate Λ = links·λ_link + switches·λ_switch, where links = G (one RNIC
  per GPU), switches = ``--switches`` or one ToR per rail per
  ``--nodes-per-switch`` nodes, and a monthly fraction f becomes the hourly
  hazard −ln(1−f)/730 (independent Bernoulli trials per hour). No faults
  arrive during downtime (the T_timeout hang, detection, reload: the job holds
  no traffic; whatever broke is swapped out by the restart). A switch fault
  counts as one concurrent fault. A further fault is assumed to leave every
  GPU a backup path (hitting the backup of an already failed-over GPU has a
  chance of about 1/G per fault).
* Cost: GPU-hours = G × wall-clock hours from start to finish; the job keeps
  its allocation through downtime and slow running. Extra = total − G·W.
  Reductions are 1 − mean(policy) / mean(baseline), of GPU-hours and of extra
  GPU-hours, against restart and against restart+scaling.

Defaults are the ReCCL paper's §4.1 setup: 16,384 GPUs (Llama3-405B), 1925
fault-free hours, 0.057 % per link and 0.051 % per ToR switch per month,
hourly checkpoints, T_detect = T_reload = 0.5 h, k = 1.03/1.20/1.50, DP 16,
node replaced after 24 h, 10,000 runs. Not given by the paper, chosen here:
8 GPUs and RNICs per node, 32 nodes per ToR on each rail (512 switches),
T_timeout = 34 s (NCCL's IB timeout 20, retry count 7), 6 s iterations for
``--checkpoint flowcheck``, and a 24 h repair estimate for Railover.

Policies
--------
fault_free
    W hours, the lower bound.
restart
    Every fault: the collective hangs for T_timeout, the fleet manager needs
    T_detect, the job reloads (T_reload) from its newest checkpoint on a hot
    spare node and redoes the t_elapsed of lost work: equation (1).
restart_scaling
    No spare node: restart as above without the faulty node's DP replica, so
    the job runs at (DP−d)/DP speed with d replicas dropped. The node comes
    back ``--node-replace-h`` after its fault; at the first checkpoint after
    that the job restarts once more (T_reload, no work lost) at full DP.
    Simplifications: all dropped replicas return together when the newest one
    does; if no replica is left to drop the job waits for that return.
failover
    ReCCL's rule, equations (2)-(4), with k from ``--k`` by the number of
    faults outstanding since the last clean start: fail over when
    t_failover < t_restart, else restart as above. Failed over, the job runs
    k times slower to its next checkpoint and then restarts cleanly (T_reload)
    to regain the hardware, exactly as the paper's model assumes.
railover
    The service's policy: the same rule at each fault, then at each
    checkpoint reached failed over it re-decides with the same arithmetic
    between a clean restart now (T_reload + X) and running degraded until the
    repair estimate (k·X), X being the work done until the last outstanding
    fault is repaired in place ``--repair-h`` after it happened. Choosing to
    run on, it fails back live at the repair (coordinated at an op count,
    cost neglected) and re-decides only when another fault arrives. k stays at
    the level of the outstanding count until that repair (conservative).

The kernels step all runs of a chunk together, one event (fault, checkpoint,
repair, return, job end) per step, so the Python loop runs about as many
times as the busiest run has events; `simulate_loop` is the plain per-run,
per-event version of the same model, kept as a reference and a benchmark.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from scheduler_svc.engine.decision import failover_cost_s, restart_cost_s
from scheduler_svc.engine.slowdown import default_k
from scheduler_svc.planning.params import JobModel

POLICIES: tuple[str, ...] = ("fault_free", "restart", "restart_scaling", "failover", "railover")
BASELINES: tuple[str, ...] = ("restart", "restart_scaling")
CHUNK_RUNS = 2500
QUANTILES = {"median": 0.5, "p90": 0.9, "p99": 0.99}

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
B = NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class PolicyStats:
    """Distribution of one policy's GPU-hours over the runs."""

    gpu_hours: dict[str, float]
    extra_gpu_hours: dict[str, float]
    mean_gpu_hours: float
    mean_extra_gpu_hours: float
    ci95_gpu_hours: float  # half-width of the 95 % confidence interval of the mean

    def as_json(self) -> dict[str, Any]:
        """Every number the tables show: the mean with its 95 % CI, and the quantiles."""
        return {
            "mean_gpu_hours": self.mean_gpu_hours,
            "ci95_gpu_hours": self.ci95_gpu_hours,
            "mean_extra_gpu_hours": self.mean_extra_gpu_hours,
            "gpu_hours": self.gpu_hours,
            "extra_gpu_hours": self.extra_gpu_hours,
        }


@dataclass(frozen=True, slots=True)
class SimulationResult:
    model: JobModel
    runs: int
    seed: int
    wall_hours: dict[str, F64]
    stats: dict[str, PolicyStats]
    reductions: dict[str, dict[str, dict[str, float]]]
    runtime_s: float


# --- the k table, extended so index = number of outstanding faults ------------------


def k_by_count(model: JobModel, max_count: int) -> F64:
    """k for 0..max_count outstanding faults (1 for none), via the engine's default_k."""
    return np.array([default_k(c, model.k) for c in range(max_count + 1)], dtype=np.float64)


def _like(value: float, shape_of: F64) -> F64:
    """A constant broadcast to an array: the engine helpers take all floats or all arrays."""
    return np.full(shape_of.shape, value, dtype=np.float64)


def _reccl_fails_over(model: JobModel, elapsed_h: F64, k: F64) -> B:
    """Equation (3) through the engine's helpers: fail over iff t_failover < t_restart."""
    fo = failover_cost_s(
        _like(model.interval_h, k),
        elapsed_h,
        _like(model.reload_h, k),
        _like(model.timeout_h, k),
        k,
    )
    rs = restart_cost_s(model.interval_h, model.detect_h, model.reload_h, model.timeout_h)
    return np.asarray(fo < rs, dtype=np.bool_)


def _runs_on_degraded(model: JobModel, work_until_repair_h: F64, k: F64) -> B:
    """Railover at a checkpoint: running degraded (k·X) beats a clean restart (T_reload + X)?

    The same equations with the remaining degraded stretch as the "interval",
    nothing elapsed, nothing to detect (the restart is planned) and no timeout.
    """
    x = work_until_repair_h
    zero = np.zeros_like(x)
    keep = failover_cost_s(x, zero, zero, zero, k)
    restart = restart_cost_s(x, zero, _like(model.reload_h, x), zero)
    return np.asarray(keep < restart, dtype=np.bool_)


# --- vectorised kernels: each returns the wall-clock hours of n runs ----------------


def _gaps(rng: np.random.Generator, rate: float, n: int) -> F64:
    if rate <= 0:
        return np.full(n, np.inf)
    return rng.exponential(1.0 / rate, n)


def _split_progress(tau: float, offset: F64) -> tuple[I64, F64]:
    """Whole checkpoints passed and the work since the newest one, for `offset` ≥ 0."""
    whole = np.floor(offset / tau)
    return whole.astype(np.int64), np.maximum(offset - whole * tau, 0.0)


def kernel_restart(model: JobModel, rng: np.random.Generator, n: int) -> F64:
    work, tau, rate = model.hours, model.interval_h, model.fault_rate_per_h
    down = model.timeout_h + model.detect_h + model.reload_h
    wall = np.zeros(n)
    # Progress is held as (checkpoint index, work since it) so restarting never
    # rounds a checkpoint away; after a restart the work since it is zero.
    ckpt = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        gap = _gaps(rng, rate, active.size)
        remaining = work - ckpt[active] * tau
        done = gap >= remaining
        wall[active[done]] += remaining[done]
        active, gap = active[~done], gap[~done]
        passed, _lost = _split_progress(tau, gap)
        ckpt[active] += passed
        wall[active] += gap + down
    return wall


def kernel_failover(model: JobModel, rng: np.random.Generator, n: int, *, railover: bool) -> F64:
    work, tau, rate = model.hours, model.interval_h, model.fault_rate_per_h
    down = model.timeout_h + model.detect_h + model.reload_h
    wall = np.zeros(n)
    ckpt = np.zeros(n, dtype=np.int64)
    since = np.zeros(n)  # work since checkpoint `ckpt`
    count = np.zeros(n, dtype=np.int64)  # faults outstanding since the last clean start
    repair = np.full(n, np.inf)  # wall time the newest outstanding fault is repaired
    running_on = np.zeros(n, dtype=np.bool_)  # railover chose to stay degraded until repair
    k_table = k_by_count(model, len(model.k) + 1)
    top = len(model.k)
    active = np.arange(n)
    while active.size:
        a = active
        c = count[a]
        k = k_table[np.minimum(c, top)]
        to_end = work - ckpt[a] * tau - since[a]
        interval_left = np.minimum(tau, work - ckpt[a] * tau) - since[a]
        # Failed over and not yet committed to running on: the next checkpoint is an event.
        stop_at_ckpt = (c > 0) & ~running_on[a]
        work_to_event = np.where(stop_at_ckpt, np.minimum(interval_left, to_end), to_end)
        wall_to_event = work_to_event * k
        to_repair = repair[a] - wall[a] if railover else np.full(a.size, np.inf)
        repaired_first = to_repair < wall_to_event
        wall_to_event = np.where(repaired_first, to_repair, wall_to_event)
        gap = _gaps(rng, rate, a.size)
        fault = gap < wall_to_event
        step = np.where(fault, gap, wall_to_event)
        passed, offset = _split_progress(tau, since[a] + step / k)
        wall[a] += step
        ckpt[a] += passed
        since[a] = offset

        # Job end: no fault before it and no repair in between.
        finished = ~fault & ~repaired_first & (work_to_event >= to_end)
        # Repair in place: fail back live.
        back = ~fault & repaired_first
        count[a[back]] = 0
        running_on[a[back]] = False
        repair[a[back]] = np.inf
        # Checkpoint reached while failed over.
        at_ckpt = ~fault & ~repaired_first & ~finished
        idx = a[at_ckpt]
        # Land exactly on the checkpoint whatever the rounding of step / k.
        ckpt[idx] += np.where(since[idx] > 0.5 * tau, 1, 0)
        since[idx] = 0.0
        if railover:
            x = (repair[idx] - wall[idx]) / k[at_ckpt]
            keep = _runs_on_degraded(model, x, k[at_ckpt])
        else:
            keep = np.zeros(idx.size, dtype=np.bool_)
        running_on[idx[keep]] = True
        clean = idx[~keep]
        wall[clean] += model.reload_h
        count[clean] = 0
        repair[clean] = np.inf

        # Fault: the ReCCL rule with k for one more outstanding fault.
        fidx = a[fault]
        k_next = k_table[np.minimum(count[fidx] + 1, top)]
        over = _reccl_fails_over(model, since[fidx], k_next)
        go = fidx[over]
        wall[go] += model.timeout_h
        count[go] += 1
        running_on[go] = False
        repair[go] = wall[go] - model.timeout_h + model.repair_h
        rs = fidx[~over]
        wall[rs] += down
        since[rs] = 0.0
        count[rs] = 0
        running_on[rs] = False
        repair[rs] = np.inf

        active = a[~finished]
    return wall


def kernel_restart_scaling(model: JobModel, rng: np.random.Generator, n: int) -> F64:
    work, tau, rate, dp = model.hours, model.interval_h, model.fault_rate_per_h, model.dp
    down = model.timeout_h + model.detect_h + model.reload_h
    wall = np.zeros(n)
    ckpt = np.zeros(n, dtype=np.int64)
    since = np.zeros(n)
    dropped = np.zeros(n, dtype=np.int64)
    back_at = np.full(n, np.inf)  # wall time the dropped nodes are back
    active = np.arange(n)
    while active.size:
        a = active
        d = dropped[a]
        slow = dp / (dp - d)  # wall hours per hour of work
        to_end = work - ckpt[a] * tau - since[a]
        interval_left = np.minimum(tau, work - ckpt[a] * tau) - since[a]
        returned = (d > 0) & (wall[a] >= back_at[a])
        # Waiting for the return, then for the next checkpoint to scale back up.
        wall_to_return = np.where((d > 0) & ~returned, back_at[a] - wall[a], np.inf)
        work_to_event = np.where(returned, np.minimum(interval_left, to_end), to_end)
        wall_to_work_event = work_to_event * slow
        is_return = wall_to_return < wall_to_work_event
        wall_to_event = np.minimum(wall_to_return, wall_to_work_event)
        gap = _gaps(rng, rate, a.size)
        fault = gap < wall_to_event
        step = np.where(fault, gap, wall_to_event)
        passed, offset = _split_progress(tau, since[a] + step / slow)
        wall[a] += step
        ckpt[a] += passed
        since[a] = offset

        finished = ~fault & ~is_return & (work_to_event >= to_end)
        # Pin the clock to the return so `returned` flips whatever the rounding.
        ridx = a[~fault & is_return]
        wall[ridx] = back_at[ridx]
        scale_up = ~fault & ~is_return & ~finished
        idx = a[scale_up]
        ckpt[idx] += np.where(since[idx] > 0.5 * tau, 1, 0)
        since[idx] = 0.0
        wall[idx] += model.reload_h
        dropped[idx] = 0
        back_at[idx] = np.inf

        fidx = a[fault]
        fault_time = wall[fidx].copy()
        wall[fidx] += down
        since[fidx] = 0.0
        can_shrink = dropped[fidx] + 1 < dp
        shrink = fidx[can_shrink]
        dropped[shrink] += 1
        back_at[shrink] = fault_time[can_shrink] + model.node_replace_h
        # Nothing left to drop: wait for the nodes, then run at full DP again.
        stuck = fidx[~can_shrink]
        wall[stuck] = np.maximum(wall[stuck], back_at[stuck])
        dropped[stuck] = 0
        back_at[stuck] = np.inf

        active = a[~finished]
    return wall


Kernel = Callable[[JobModel, np.random.Generator, int], F64]

KERNELS: dict[str, Kernel] = {
    "fault_free": lambda m, _rng, n: np.full(n, m.hours),
    "restart": kernel_restart,
    "restart_scaling": kernel_restart_scaling,
    "failover": lambda m, rng, n: kernel_failover(m, rng, n, railover=False),
    "railover": lambda m, rng, n: kernel_failover(m, rng, n, railover=True),
}


# --- running and summarising --------------------------------------------------------


def run_policies(
    model: JobModel,
    runs: int,
    seed: int,
    policies: Iterable[str] = POLICIES,
    on_chunk: Callable[[int], None] | None = None,
) -> dict[str, F64]:
    """Wall-clock hours of every run under each policy; `on_chunk(runs_done)` reports progress."""
    policies = tuple(policies)
    # One independent stream per policy and chunk: results do not depend on
    # which policies are asked for.
    streams = np.random.SeedSequence(seed).spawn(len(POLICIES))
    out: dict[str, F64] = {}
    for policy in policies:
        chunk_seeds = streams[POLICIES.index(policy)].spawn(math.ceil(runs / CHUNK_RUNS))
        parts = []
        for i, chunk_seed in enumerate(chunk_seeds):
            n = min(CHUNK_RUNS, runs - i * CHUNK_RUNS)
            parts.append(KERNELS[policy](model, np.random.default_rng(chunk_seed), n))
            if on_chunk is not None:
                on_chunk(n)
        out[policy] = np.concatenate(parts)
    return out


def summarise(model: JobModel, wall_hours: F64) -> PolicyStats:
    gpu_hours = wall_hours * model.gpus
    extra = gpu_hours - model.gpus * model.hours
    qs = list(QUANTILES.values())
    total_q = np.quantile(gpu_hours, qs)
    extra_q = np.quantile(extra, qs)
    n = gpu_hours.size
    sd = float(np.std(gpu_hours, ddof=1)) if n > 1 else 0.0
    return PolicyStats(
        gpu_hours={name: float(v) for name, v in zip(QUANTILES, total_q, strict=True)},
        extra_gpu_hours={name: float(v) for name, v in zip(QUANTILES, extra_q, strict=True)},
        mean_gpu_hours=float(np.mean(gpu_hours)),
        mean_extra_gpu_hours=float(np.mean(extra)),
        ci95_gpu_hours=1.96 * sd / math.sqrt(n),
    )


def reductions(stats: dict[str, PolicyStats]) -> dict[str, dict[str, dict[str, float]]]:
    """Per policy and baseline: the fraction of mean GPU-hours and mean extra GPU-hours saved."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for policy, st in stats.items():
        per: dict[str, dict[str, float]] = {}
        for base in BASELINES:
            if base == policy or base not in stats:
                continue
            ref = stats[base]
            per[f"vs_{base}"] = {
                "gpu_hours": 1.0 - st.mean_gpu_hours / ref.mean_gpu_hours,
                "extra_gpu_hours": (
                    1.0 - st.mean_extra_gpu_hours / ref.mean_extra_gpu_hours
                    if ref.mean_extra_gpu_hours > 0
                    else 0.0
                ),
            }
        out[policy] = per
    return out


def simulate(
    model: JobModel,
    runs: int,
    seed: int,
    policies: Iterable[str] = POLICIES,
    on_chunk: Callable[[int], None] | None = None,
) -> SimulationResult:
    """Run the Monte Carlo and summarise it."""
    started = time.perf_counter()
    walls = run_policies(model, runs, seed, policies, on_chunk)
    runtime = time.perf_counter() - started
    stats = {policy: summarise(model, wall) for policy, wall in walls.items()}
    return SimulationResult(
        model=model,
        runs=runs,
        seed=seed,
        wall_hours=walls,
        stats=stats,
        reductions=reductions(stats),
        runtime_s=runtime,
    )


def result_json(result: SimulationResult) -> dict[str, Any]:
    """The fixed `simulate --json` document."""
    params = result.model.describe()
    params["runs"] = result.runs
    params["seed"] = result.seed
    return {
        "parameters": params,
        "policies": {policy: st.as_json() for policy, st in result.stats.items()},
        "reductions": result.reductions,
        "runtime_s": result.runtime_s,
    }


# --- the plain per-event loop: reference implementation and benchmark baseline -------


def simulate_loop(model: JobModel, runs: int, seed: int, policy: str) -> list[float]:
    """Wall hours of each run, one Python iteration per event and run (slow on purpose)."""
    rng = random.Random(seed)  # noqa: S311  # simulation, not secrets
    return [_one_run(model, rng, policy) for _ in range(runs)]


def _one_run(m: JobModel, rng: random.Random, policy: str) -> float:
    work, tau, rate = m.hours, m.interval_h, m.fault_rate_per_h
    down = m.timeout_h + m.detect_h + m.reload_h
    if policy == "fault_free":
        return work

    def gap() -> float:
        return rng.expovariate(rate) if rate > 0 else math.inf

    def k_of(count: int) -> float:
        return default_k(count, m.k) if count else 1.0

    wall, ckpt, since = 0.0, 0, 0.0
    count, repair, running_on = 0, math.inf, False  # failover / railover
    dropped, back_at = 0, math.inf  # restart_scaling
    while True:
        to_end = work - ckpt * tau - since
        interval_left = min(tau, work - ckpt * tau) - since
        if policy in ("failover", "railover"):
            slow = k_of(count)
            stop_at_ckpt = count > 0 and not running_on
        elif policy == "restart_scaling":
            slow = m.dp / (m.dp - dropped)
            stop_at_ckpt = dropped > 0 and wall >= back_at
        else:
            slow, stop_at_ckpt = 1.0, False
        work_to_event = min(interval_left, to_end) if stop_at_ckpt else to_end
        wall_to_event = work_to_event * slow
        other = math.inf
        if policy == "railover" and count > 0:
            other = repair - wall
        elif policy == "restart_scaling" and dropped > 0 and wall < back_at:
            other = back_at - wall
        g = gap()
        step = min(g, wall_to_event, other)
        wall += step
        progressed = since + step / slow
        passed = math.floor(progressed / tau)
        ckpt += passed
        since = max(progressed - passed * tau, 0.0)
        if step == g:  # a fault
            if policy == "restart":
                wall += down
                since = 0.0
            elif policy == "restart_scaling":
                fault_time = wall
                wall += down
                since = 0.0
                if dropped + 1 < m.dp:
                    dropped += 1
                    back_at = fault_time + m.node_replace_h
                else:
                    wall, dropped, back_at = max(wall, back_at), 0, math.inf
            else:
                k_next = k_of(count + 1)
                fo = failover_cost_s(tau, since, m.reload_h, m.timeout_h, k_next)
                if fo < restart_cost_s(tau, m.detect_h, m.reload_h, m.timeout_h):
                    repair = wall + m.repair_h
                    wall += m.timeout_h
                    count += 1
                else:
                    wall += down
                    since, count, repair = 0.0, 0, math.inf
                running_on = False
        elif step == other:  # repair in place (railover) or the nodes are back (scaling)
            if policy == "railover":
                count, repair, running_on = 0, math.inf, False
            else:
                wall = back_at
        elif work_to_event >= to_end:
            return wall
        else:  # a checkpoint reached while degraded or waiting to scale back up
            if since > 0.5 * tau:
                ckpt += 1
            since = 0.0
            if policy == "restart_scaling":
                wall += m.reload_h
                dropped, back_at = 0, math.inf
                continue
            keep = False
            if policy == "railover":
                x = (repair - wall) / slow
                keep = failover_cost_s(x, 0.0, 0.0, 0.0, slow) < restart_cost_s(
                    x, 0.0, m.reload_h, 0.0
                )
            if keep:
                running_on = True
            else:
                wall += m.reload_h
                count, repair = 0, math.inf
