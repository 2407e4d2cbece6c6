"""Twin runs side by side in processes of their own give what they give one after the other,
in the order asked, with each run's progress reported up to its end."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

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
