"""Twin runs side by side in processes of their own give what they give one after the other,
in the order asked, with each run's progress reported up to its end."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from railover_testing.waiting import wait_until
from scheduler_svc.engine.decision import Policy
from scheduler_svc.twin.cluster import ClusterSpec, FaultKind, Reports
from scheduler_svc.twin.runs import Run, run_all

SPEC = ClusterSpec(nodes=4, spares=1, nodes_per_leaf=4, jobs=1)


def books(result: Any) -> dict[str, Any]:
    out: dict[str, Any] = result.as_json()
    del out["wall_s"]
    return out


def test_runs_in_two_processes_equal_the_same_runs_here_in_order() -> None:
    links_only = {k: 0.0 for k in FaultKind if k not in (FaultKind.LINK, FaultKind.GPU)}
    runs = [
        Run(SPEC, 0.5, seed, 2000.0, policy, Reports(), per_component_h=links_only, curve=seed == 2)
        for policy in (Policy.RESTART_ONLY, Policy.RAILOVER)
        for seed in (1, 2)
    ]
    seen: dict[int, list[float]] = defaultdict(list)
    apart = run_all(runs, workers=2, progress=lambda i, f: seen[i].append(f))
    here = run_all(runs, workers=1)
    assert [books(d.result) for d in apart] == [books(d.result) for d in here]
    assert [(d.result.policy, d.result.seed) for d in apart] == [
        (r.policy.value, r.seed) for r in runs
    ]
    assert sum(sum(d.result.faults.values()) for d in here) > 0  # the runs did something
    assert sorted(seen) == [0, 1, 2, 3]
    for fractions in seen.values():
        assert fractions == sorted(fractions) and fractions[-1] >= 0.99
    curves = [d.curve for d in apart]
    assert [c is not None for c in curves] == [False, True, False, True]
    for run, d in zip(runs, apart, strict=True):
        if d.curve is not None:
            assert d.curve.lost[-1] == d.result.gpu_hours_total
            assert d.curve.days[-1] == run.days


def test_no_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="workers: at least 1, got 0"):
        run_all([], workers=0)


PARENT = """
import sys
from scheduler_svc.engine.decision import Policy
from scheduler_svc.twin.cluster import ClusterSpec, Reports
from scheduler_svc.twin.runs import Run, run_all

spec = ClusterSpec(nodes=4, spares=1, nodes_per_leaf=4, jobs=1)
runs = [Run(spec, 300.0, seed, 0.0, Policy.RAILOVER, Reports()) for seed in (1, 2)]
run_all(runs, workers=2, progress=lambda i, f: print(i, f, flush=True))
"""


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_workers_end_when_the_twin_is_killed(tmp_path: Path) -> None:
    """A scheduler's time limit kills `railover twin` (SIGKILL): its workers, each in the
    middle of a 300-day run, end with it rather than run on for minutes."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        parent.stdout.readline()  # a run reports progress: the workers are running
        workers = {c for c in children(parent.pid) if alive(c)}
        assert len(workers) >= 2, workers  # the two workers (and spawn's resource tracker)
    finally:
        parent.kill()
        parent.wait()
    assert wait_until(lambda: not any(alive(w) for w in workers), timeout=60), [
        w for w in workers if alive(w)
    ]
