"""Issue 28's model-based test in `make test`: a few random sequences on each store.

tests/scheduler_svc/sequences_machine.py drives the service and states the invariants;
benchmarks/bench_sequences_model.py runs thousands of sequences. Here
RAILOVER_SEQUENCES_EXAMPLES (default 8) sequences of RAILOVER_SEQUENCES_STEPS (default 25)
steps each, derandomized: the same sequences on every run.

What it found is in test_sequences_model_findings.py, each minimised to a short named
sequence, fixed since.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.scheduler_svc.sequences_machine import SequencesMachine, connect_to

EXAMPLES = int(os.environ.get("RAILOVER_SEQUENCES_EXAMPLES", "8"))
STEPS = int(os.environ.get("RAILOVER_SEQUENCES_STEPS", "25"))


def run(machine: type[SequencesMachine], db_url: str, *, shrink: bool = True) -> None:
    class OnThisStore(machine):  # type: ignore[valid-type,misc]
        connect = staticmethod(connect_to(db_url))

    phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if shrink else ())
    run_state_machine_as_test(
        OnThisStore,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=True,
            database=None,
            phases=phases,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_random_sequences_keep_the_invariants(db_url: str) -> None:
    run(SequencesMachine, db_url)
