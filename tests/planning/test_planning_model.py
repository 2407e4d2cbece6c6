"""The simulator against its exact expectation and the plain loop; the failover rule's promise."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_svc.engine.decision import DecisionInputs, decide
from scheduler_svc.planning.analytic import expected_hours, restart_interval_h
from scheduler_svc.planning.params import JobModel, ParamError, hourly_hazard
from scheduler_svc.planning.simulate import POLICIES, simulate, simulate_loop

# 99 % two-sided: with fixed seeds each check is deterministic, and a correct
# model lands outside its interval on one check in a hundred.
Z99_OVER_Z95 = 2.576 / 1.96

CASES = {
    # The paper's fault rates on a smaller, shorter job.
    "paper-rates": {"gpus": 4096, "hours": 400.0},
    # Many concurrent faults: k steps through the whole table, the rule flips at thresholds.
    "busy": {
        "gpus": 4096,
        "hours": 300.0,
        "link_failure_monthly": 0.2,
        "k": (1.1, 1.4, 3.0),
        "detect_h": 0.2,
        "checkpoint_interval_h": 2.0,
    },
    # A job length that is not a whole number of intervals.
    "ragged": {"gpus": 2048, "hours": 250.5, "link_failure_monthly": 0.05, "detect_h": 0.05},
    # Per-iteration checkpoints.
    "flowcheck": {"gpus": 16384, "hours": 150.0, "checkpoint": "flowcheck"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_simulated_mean_is_within_its_confidence_interval_of_the_analytic_expectation(
    case: str,
) -> None:
    model = JobModel(**CASES[case])  # type: ignore[arg-type]  # keyword table above
    result = simulate(model, 6000, seed=7, policies=("restart", "failover"))
    row = expected_hours([model])[0]
    for policy, expected in (("restart", row.restart_hours), ("failover", row.failover_hours)):
        stats = result.stats[policy]
        mean_h = stats.mean_gpu_hours / model.gpus
        half_width_h = stats.ci95_gpu_hours / model.gpus * Z99_OVER_Z95
        assert abs(mean_h - expected) <= half_width_h, (case, policy, mean_h, expected)


def test_restart_closed_form_matches_a_hand_computation() -> None:
    model = JobModel(gpus=8, hours=1.0, link_failure_monthly=0.3, switch_failure_monthly=0.0)
    rate = model.fault_rate_per_h
    down = model.timeout_h + model.detect_h + model.reload_h
    by_hand = (math.exp(rate) - 1) * (1 / rate + down)
    got = float(restart_interval_h(model, np.array([rate]), 1.0)[0])
    assert got == pytest.approx(by_hand, rel=1e-12)


def test_without_faults_every_policy_takes_the_fault_free_time() -> None:
    model = JobModel(gpus=64, hours=50.0, link_failure_monthly=0.0, switch_failure_monthly=0.0)
    result = simulate(model, 50, seed=1)
    for policy in POLICIES:
        assert np.all(result.wall_hours[policy] == 50.0)
    row = expected_hours([model])[0]
    assert row.restart_hours == pytest.approx(50.0)
    assert row.failover_hours == pytest.approx(50.0)


@pytest.mark.parametrize(
    "overrides",
    [
        {"gpus": 2048, "hours": 300.0, "link_failure_monthly": 0.1, "repair_h": 4.0, "dp": 4},
        {"gpus": 2048, "hours": 200.0, "link_failure_monthly": 0.05, "checkpoint": "flowcheck"},
    ],
)
def test_vectorised_kernels_agree_with_the_plain_loop(overrides: dict[str, object]) -> None:
    model = JobModel(**overrides)  # type: ignore[arg-type]  # keyword table above
    fast = simulate(model, 3000, seed=3)
    for policy in POLICIES:
        slow = np.array(simulate_loop(model, 1500, 11, policy))
        fast_mean = fast.stats[policy].mean_gpu_hours / model.gpus
        fast_half = fast.stats[policy].ci95_gpu_hours / model.gpus / 1.96
        slow_half = float(np.std(slow, ddof=1)) / math.sqrt(slow.size)
        # Two independent estimates of one mean: 4 joint standard errors.
        assert abs(fast_mean - slow.mean()) <= 4 * math.hypot(fast_half, slow_half) + 1e-9, policy


def test_same_seed_same_answer_and_policies_do_not_share_streams() -> None:
    model = JobModel(gpus=1024, hours=200.0, link_failure_monthly=0.05)
    a = simulate(model, 300, seed=5)
    b = simulate(model, 300, seed=5, policies=("railover",))
    assert np.array_equal(a.wall_hours["railover"], b.wall_hours["railover"])


def test_railover_fails_back_instead_of_restarting_when_repair_is_quick() -> None:
    quick = JobModel(gpus=4096, hours=300.0, link_failure_monthly=0.05, repair_h=2.0)
    result = simulate(quick, 2000, seed=2, policies=("failover", "railover"))
    assert result.stats["railover"].mean_gpu_hours < result.stats["failover"].mean_gpu_hours


def test_flowcheck_makes_restart_cheaper() -> None:
    hourly = JobModel(gpus=4096, hours=300.0)
    per_iteration = JobModel(gpus=4096, hours=300.0, checkpoint="flowcheck")
    rows = expected_hours([hourly])[0], expected_hours([per_iteration])[0]
    assert rows[1].restart_hours < rows[0].restart_hours


def test_the_simulators_failover_rule_is_the_engines_decision() -> None:
    # decide() in seconds must pick failover exactly where the simulator's hour arithmetic does.
    model = JobModel(detect_h=0.1, reload_h=0.3, k=(1.2,))
    for elapsed_h in np.linspace(0.0, model.interval_h, 41):
        decision = decide(
            DecisionInputs(
                checkpoint_interval_s=model.interval_h * 3600,
                elapsed_s=float(elapsed_h) * 3600,
                detect_s=model.detect_h * 3600,
                reload_s=model.reload_h * 3600,
                timeout_s=model.timeout_s,
                k=1.2,
                k_source="default",
                gpus=model.gpus,
            )
        )
        threshold_h = (model.interval_h * 0.2 - model.detect_h) / 1.2
        if abs(elapsed_h - threshold_h) > 1e-9:
            assert (decision.action.value == "failover") == (elapsed_h > threshold_h)


def test_hourly_hazard_keeps_the_monthly_probability() -> None:
    assert 1 - math.exp(-hourly_hazard(0.00057) * 730) == pytest.approx(0.00057, rel=1e-12)


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"link_failure_monthly": -0.1}, "--link-failure-monthly"),
        ({"k": (1.03, 0.9)}, "--k"),
        ({"gpus": 1001}, "--gpus"),
        ({"dp": 1}, "--dp"),
        ({"checkpoint": "weekly"}, "--checkpoint"),
        ({"reload_h": float("nan")}, "--reload-h"),
    ],
)
def test_bad_parameters_name_their_flag(overrides: dict[str, object], flag: str) -> None:
    with pytest.raises(ParamError) as err:
        JobModel(**overrides)  # type: ignore[arg-type]  # deliberately wrong values
    assert err.value.flag == flag


def test_dp_must_split_the_nodes_into_whole_replicas() -> None:
    with pytest.raises(ParamError) as err:
        JobModel(gpus=64, dp=3).check_replicas()
    assert err.value.flag == "--dp"


ks = st.floats(min_value=1.0, max_value=4.0)


@settings(max_examples=60, deadline=None)
@given(
    k_table=st.lists(ks, min_size=1, max_size=4).map(lambda v: tuple(sorted(v))),
    interval_h=st.floats(min_value=0.05, max_value=6.0),
    detect_h=st.floats(min_value=0.0, max_value=2.0),
    reload_h=st.floats(min_value=0.0, max_value=2.0),
    timeout_s=st.floats(min_value=0.0, max_value=600.0),
    link_monthly=st.floats(min_value=1e-6, max_value=0.3),
)
def test_failover_when_better_is_never_worse_than_restart_in_expectation(  # noqa: PLR0917  # hypothesis passes one argument per strategy
    k_table: tuple[float, ...],
    interval_h: float,
    detect_h: float,
    reload_h: float,
    timeout_s: float,
    link_monthly: float,
) -> None:
    model = JobModel(
        gpus=4096,
        hours=interval_h * 20,
        link_failure_monthly=link_monthly,
        checkpoint_interval_h=interval_h,
        detect_h=detect_h,
        reload_h=reload_h,
        timeout_s=timeout_s,
        k=k_table,
    )
    row = expected_hours([model])[0]
    assert row.failover_hours <= row.restart_hours * (1 + 1e-9)
