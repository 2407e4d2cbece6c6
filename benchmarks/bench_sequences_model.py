"""The model-based test of issue 28 as a long profile: thousands of random sequences.

Runs tests/scheduler_svc/sequences_machine.py (the service in this process, on a manual
clock, a fresh store for each sequence) for --examples sequences of up to --steps steps,
and prints what it ran: sequences, steps, steps/s, each step's wall time (the rule and
the checks of every invariant after it; p50/p95/p99) and the falsifying example, if any
(a shrunk one: the sequences counted include those shrinking ran).
Not part of `make test` (tests/scheduler_svc/test_sequences_model.py runs a few there).

    .venv/bin/python -m benchmarks.bench_sequences_model \
        [--examples 2000] [--steps 40] [--store sqlite|postgres] [--minutes 10]

What it found before is in tests/scheduler_svc/test_sequences_model_findings.py.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from benchmarks import benchlib
from scheduler_svc.store.db import upgrade
from tests.scheduler_svc.sequences_machine import SequencesMachine, connect_to


@contextmanager
def store(kind: str) -> Iterator[str]:
    """A migrated, empty store of `kind`, removed afterwards."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="railover-bench-") as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            upgrade(url)
            yield url
        return
    with benchlib.scratch_store(kind) as plain:
        url = plain.replace("postgresql://", "postgresql+psycopg://")
        upgrade(url)
        yield url


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument(
        "--minutes", type=float, default=None, help="stop after this long (at a chunk's end)"
    )
    ap.add_argument("--chunk", type=int, default=25, help="sequences per progress line")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the service's per-request warnings
    m = benchlib.machine()
    print(f"machine: {m['nproc']} cores, {m['cpu']}; store {args.store}")
    step_s: list[float] = []
    sequences = [0]

    with store(args.store) as url:

        class Profiled(SequencesMachine):
            connect = staticmethod(connect_to(url))

            def __init__(self) -> None:
                super().__init__()
                sequences[0] += 1

        Profiled.step_s = step_s
        config = settings(
            max_examples=args.chunk,
            stateful_step_count=args.steps,
            deadline=None,
            database=None,
            phases=(Phase.explicit, Phase.generate, Phase.shrink),
            suppress_health_check=list(HealthCheck),
        )
        started = time.perf_counter()
        falsified = None
        # Chunks of --chunk sequences, each from a new random seed: a line of progress
        # each, and --minutes ends the run between two of them.
        while sequences[0] < args.examples and falsified is None:
            try:
                run_state_machine_as_test(Profiled, settings=config)
            except AssertionError:
                falsified = traceback.format_exc()
            wall = time.perf_counter() - started
            print(f"  {sequences[0]} sequences, {len(step_s)} steps, {wall:.0f} s", flush=True)
            if args.minutes is not None and wall > args.minutes * 60:
                break
    ms = [x * 1000 for x in step_s]
    print(
        f"sequences {sequences[0]}, steps {len(ms)} in {wall:.0f} s: "
        f"{len(ms) / wall:.1f} steps/s; step ms p50 {benchlib.percentile(ms, 50):.1f} "
        f"p95 {benchlib.percentile(ms, 95):.1f} p99 {benchlib.percentile(ms, 99):.1f} "
        f"max {max(ms):.1f}"
    )
    print("falsifying example:" if falsified else "no falsifying example")
    if falsified:
        print(falsified)


if __name__ == "__main__":
    main()
