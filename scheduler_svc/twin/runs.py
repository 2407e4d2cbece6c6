"""Many twin runs (policies × seeds), each in a process of its own when asked.

A run holds a whole service (app, store, its threads) and is CPU-bound in Python, so runs
go side by side only as processes: `run_all(..., workers=N)` starts N by `spawn` (never
`fork`: a parent with a live service has threads) and hands each a `Run`, which names
everything the run needs and nothing that cannot cross a process boundary. Results come
back in the order the runs were given, whatever order they finish in; progress comes back
as (run index, fraction done) through a queue.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import queue
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from scheduler_svc.engine.decision import Policy
from scheduler_svc.planning.params import JobModel
from scheduler_svc.twin.books import Curve, TwinResult
from scheduler_svc.twin.cluster import (
    ClusterSpec,
    FaultKind,
    JobShape,
    Reports,
    hard_failures_per_h,
    trace,
)
from scheduler_svc.twin.loop import Twin
from scheduler_svc.twin.plot import LossCurve

# A run reports progress at most this often (fractions of its simulated time): a month of
# events would otherwise put millions of messages through the queue.
PROGRESS_STEP = 0.005
QUIET = ("scheduler_svc", "railover")  # loggers whose levels the workers take from here
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
_WORKER: dict[str, Any] = {}  # in a worker process: what it was handed at its start


@dataclass(frozen=True, slots=True)
class Run:
    """One twin run: `per_component_h` (fitted from a history) replaces the rates of the
    kinds it names, and `shapes` (the history's jobs) the job mix; `curve` samples the loss
    over time for --plot."""

    spec: ClusterSpec
    days: float
    seed: int
    fault_scale: float
    policy: Policy
    reports: Reports
    model: JobModel | None = None
    per_component_h: Mapping[FaultKind, float] | None = None
    shapes: tuple[JobShape, ...] = ()
    spare_reserve: int = 0
    # Spares priced by the trace's rate of lost GPUs and dead nodes (cluster.hard_failures_per_h).
    price_spares: bool = False
    curve: bool = False


@dataclass(frozen=True, slots=True)
class Done:
    result: TwinResult
    curve: Curve | None


def hard_rate(run: Run) -> float:
    """The lost GPUs and dead nodes per hour of the run's trace, which the service prices
    its spares by under --price-spares."""
    return hard_failures_per_h(
        run.spec, run.model or JobModel(), run.fault_scale, run.per_component_h
    )


def run_one(run: Run, progress: Callable[[float], None] | None = None) -> Done:
    faults = None
    if run.per_component_h is not None:
        model = run.model or JobModel()
        faults = trace(
            run.spec,
            model,
            run.days,
            run.seed,
            run.fault_scale,
            per_component_h=run.per_component_h,
        )
    twin = Twin(
        run.spec,
        days=run.days,
        seed=run.seed,
        fault_scale=run.fault_scale,
        policy=run.policy,
        model=run.model,
        faults=faults,
        progress=progress,
        reports=run.reports,
        shapes=run.shapes,
        spare_reserve=run.spare_reserve,
        hard_failures_per_h=hard_rate(run) if run.price_spares else 0.0,
    )
    sampler = None
    if run.curve:
        sampler = LossCurve(twin, then=progress)
        twin.on_progress = sampler
    result = twin.run()
    if progress is not None:
        progress(1.0)  # the twin reports its events; the quiet end after them is done too
    if sampler is None:
        return Done(result, None)
    sampler.finish(result.gpu_hours_total)
    return Done(result, Curve(sampler.days, sampler.lost))


def default_workers(runs: int) -> int:
    """One process per run, up to the CPUs this process may use."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(runs, cpus or 1))


def run_all(
    runs: Sequence[Run],
    *,
    workers: int,
    progress: Callable[[int, float], None] | None = None,
) -> list[Done]:
    """Every run, in `workers` processes (1: here, one after the other); `progress(i, f)`
    says run i is a fraction f through its simulated time."""
    if workers < 1:
        raise ValueError(f"workers: at least 1, got {workers}")
    if workers == 1 or len(runs) == 1:
        return [run_one(r, _reporter(progress, i)) for i, r in enumerate(runs)]
    ctx = multiprocessing.get_context("spawn")
    # The workers log as quietly as this process does (a spawned process starts afresh),
    # and put their progress on a queue they are handed when they start.
    levels = {name: logging.getLogger(name).level for name in QUIET}
    updates = ctx.Queue()
    with ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_worker_start, initargs=(levels, updates)
    ) as pool:
        pending: dict[Future[Done], int] = {
            pool.submit(_in_worker, r, i): i for i, r in enumerate(runs)
        }
        done: dict[int, Done] = {}
        while pending:
            finished, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            _drain(updates, progress, done)
            for future in finished:
                index = pending.pop(future)
                done[index] = future.result()  # a run's error is raised here
                # A worker's last updates can reach the queue after its result reaches
                # here: the run is through, whatever the queue has said so far.
                if progress is not None:
                    progress(index, 1.0)
        _drain(updates, progress, done)
    return [done[i] for i in range(len(runs))]


def _reporter(
    progress: Callable[[int, float], None] | None, index: int
) -> Callable[[float], None] | None:
    if progress is None:
        return None
    last = [-1.0]

    def report(fraction: float) -> None:
        if fraction - last[0] >= PROGRESS_STEP or fraction >= 1.0:
            last[0] = fraction
            progress(index, fraction)

    return report


def _worker_start(levels: Mapping[str, int], updates: Any) -> None:
    """A worker logs as the parent does, reports progress on `updates`, and ends with the
    parent: one stopped by SIGTERM or SIGKILL (a scheduler's time limit) would otherwise
    leave its workers running their runs to the end, minutes each."""
    _WORKER["updates"] = updates
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() == 1:  # the parent was gone before the call took effect
            os._exit(1)


def _in_worker(run: Run, index: int) -> Done:
    updates = _WORKER["updates"]
    return run_one(run, _reporter(lambda i, f: updates.put((i, f)), index))


def _drain(
    updates: Any, progress: Callable[[int, float], None] | None, done: Mapping[int, Done]
) -> None:
    """Hand on the updates received so far, but none of a run already reported done."""
    while True:
        try:
            index, fraction = updates.get_nowait()
        except queue.Empty:
            return
        if progress is not None and index not in done:
            progress(index, fraction)
