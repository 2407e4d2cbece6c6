"""Equations (1)-(4) of the design, table-driven."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler_svc.engine.decision import (
    Action,
    DecisionInputs,
    at_least,
    decide,
    failover_cost_s,
    failover_threshold_s,
    ib_timeout_s,
    restart_cost_s,
    spare_price_s,
    spare_usable,
)
from scheduler_svc.engine.slowdown import KSource, default_k, estimate_k, modelled_k


def inputs(**kw: float | int | bool | str) -> DecisionInputs:
    base: dict[str, float | int | bool | str] = {
        "checkpoint_interval_s": 3600.0,
        "elapsed_s": 0.0,
        "detect_s": 0.0,
        "reload_s": 600.0,
        "timeout_s": 30.0,
        "k": 1.5,
        "k_source": "measured",
        "gpus": 16,
    }
    base.update(kw)
    return DecisionInputs(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("interval", "detect", "k", "threshold"),
    [
        (3600, 0, 1.5, 1200.0),  # (5): a third of the interval
        (3600, 0, 1.03, 3600 * 0.03 / 1.03),
        (3600, 1800, 1.5, 0.0),  # detection as long as the loss: always fail over
        (3600, 0, 1.0, 0.0),  # no slowdown: failing over is free
        (7200, 600, 1.2, (7200 * 0.2 - 600) / 1.2),
    ],
)
def test_threshold_matches_equation_4(
    interval: float, detect: float, k: float, threshold: float
) -> None:
    assert failover_threshold_s(interval, detect, k) == pytest.approx(threshold)


@pytest.mark.parametrize(
    ("elapsed", "action"),
    [
        (0, Action.RESTART),
        (1000, Action.RESTART),
        (1199, Action.RESTART),
        (1201, Action.FAILOVER),
        (1500, Action.FAILOVER),
        (3599, Action.FAILOVER),
    ],
)
def test_decision_flips_at_the_threshold(elapsed: float, action: Action) -> None:
    d = decide(inputs(elapsed_s=elapsed))
    assert d.action == action
    assert d.threshold_s == pytest.approx(1200.0)
    assert d.costs_s["restart"] == pytest.approx(30 + 0 + 600 + 3600)
    assert d.costs_s["failover"] == pytest.approx(30 + 1.5 * (3600 - elapsed) + 600)
    assert d.costs_gpu_s["restart"] == pytest.approx(d.costs_s["restart"] * 16)  # type: ignore[operator]
    assert d.reason.startswith("fail over" if action == Action.FAILOVER else "restart")


def test_costs_agree_with_equations_on_arrays() -> None:
    elapsed = np.array([0.0, 1000.0, 1500.0])
    fo = failover_cost_s(
        np.full(3, 3600.0), elapsed, np.full(3, 600.0), np.full(3, 30.0), np.full(3, 1.5)
    )
    rs = restart_cost_s(np.full(3, 3600.0), np.zeros(3), np.full(3, 600.0), np.full(3, 30.0))
    assert list(fo < rs) == [False, False, True]


def test_no_path_is_never_a_failover() -> None:
    d = decide(inputs(elapsed_s=3500, path_available=False))
    assert d.action == Action.RESTART
    assert d.costs_s["failover"] is None
    assert "no usable path" in d.reason


def test_no_path_without_spare_prefers_scaling() -> None:
    d = decide(
        inputs(
            elapsed_s=3500,
            path_available=False,
            spare_nodes=False,
            node_replace_s=86400,
            allow_scaling=True,
            dp_size=16,
            new_dp_size=15,
        )
    )
    assert d.action == Action.RESTART_SCALED
    assert d.costs_s["restart_scaled"] == pytest.approx(30 + 600 + 3600 * 16 / 15)
    assert d.costs_gpu_s["restart_scaled"] == pytest.approx(d.costs_s["restart_scaled"] * 15)  # type: ignore[operator]


def test_restart_scaled_needs_permission() -> None:
    d = decide(
        inputs(elapsed_s=0, spare_nodes=False, node_replace_s=86400, dp_size=16, new_dp_size=15)
    )
    assert d.costs_s["restart_scaled"] is None
    assert d.action == Action.FAILOVER  # a day's wait makes degraded running cheaper


@pytest.mark.parametrize("mean", [0.0, 0.3, 2.9, 25.0, 900.0])
def test_at_least_is_the_poisson_tail(mean: float) -> None:
    """P(N >= n) from the distribution's own terms where they are representable, and from
    a million draws where e^-mean is not (900)."""
    for n in (0, 1, 2, 3, 8, 30, 900, 1000):
        if mean < 700:
            term, below = math.exp(-mean), 0.0
            for i in range(n):  # each term from the one before: e^-mean mean^i / i!
                below += term
                term *= mean / (i + 1)
            assert at_least(n, mean) == pytest.approx(1 - below, abs=1e-12)
        else:
            draws = np.random.default_rng(1).poisson(mean, 1_000_000)
            assert at_least(n, mean) == pytest.approx(float(np.mean(draws >= n)), abs=2e-3)
    assert at_least(0, mean) == 1.0


def test_a_spare_is_priced_by_the_faults_only_a_replacement_fixes() -> None:
    """0.1 lost GPUs or dead nodes an hour, a day until the faulty node is back: 2.4 of them
    are expected meanwhile. Taking one of 3 free spares leaves one of them waiting for a
    node when 3 or more come: P = 1 - e^-2.4 (1 + 2.4 + 2.88) = 0.4303."""
    p3 = 1 - math.exp(-2.4) * (1 + 2.4 + 2.4**2 / 2)
    assert spare_price_s(3, 0.1, 86400, 7200) == pytest.approx(p3 * 7200)
    assert spare_price_s(3, 0.1, 86400, 7200) == pytest.approx(3098.1, abs=0.1)
    assert spare_price_s(1, 0.1, 86400, 7200) == pytest.approx((1 - math.exp(-2.4)) * 7200)
    assert spare_price_s(30, 0.1, 86400, 7200) < 1e-9  # plenty to spare
    for free in (None, 0, -1):  # not said, or none to take
        assert spare_price_s(free, 0.1, 86400, 7200) == 0.0
    assert spare_price_s(3, 0.0, 86400, 7200) == 0.0  # not priced
    assert spare_price_s(3, 0.1, 0.0, 7200) == 0.0  # back at once


def test_a_priced_spare_turns_an_early_restart_into_a_failover() -> None:
    """Early in the interval a restart onto a spare (4,230 s) beats failing over (5,430 s);
    priced at 3,098 s the spare makes it 7,328 s, and the job fails over. Without a path
    the restart takes the spare whatever its price; a restart waiting for a node pays the
    wait, not the price."""
    early = {"elapsed_s": 0, "node_replace_s": 7200, "spares_free": 3}
    price = spare_price_s(3, 0.1, 86400, 7200)
    assert decide(inputs(**early)).action == Action.RESTART
    priced = decide(inputs(**early, spare_price_s=price))
    assert priced.action == Action.FAILOVER
    assert priced.costs_s["restart"] == pytest.approx(restart_cost_s(3600, 0, 600, 30) + price)
    assert priced.notes == (
        "a restart takes one of 3 free spares: 51.6 min of its cost is the wait it may leave "
        "a lost GPU or dead node",
    )
    assert decide(inputs(**early)).notes == ()
    no_path = decide(inputs(**early, spare_price_s=price, path_available=False))
    assert no_path.action == Action.RESTART
    assert no_path.costs_s["restart"] == pytest.approx(restart_cost_s(3600, 0, 600, 30) + price)
    waits = decide(inputs(**early | {"spares_free": 0}, spare_price_s=price))
    assert waits.costs_s["restart"] == pytest.approx(restart_cost_s(3600, 0, 600 + 7200, 30))
    assert waits.notes == ()
    with pytest.raises(ValueError, match="spare_price_s must be a finite number >= 0"):
        inputs(spare_price_s=-1.0)


def test_the_last_spares_are_kept_for_faults_only_a_replacement_fixes() -> None:
    """Early in the interval a restart is cheaper than running degraded, if a spare is free
    beyond the reserve; at the reserve the restart would wait for a node, so the job fails
    over. A fault no failover escapes (no path left) may take a kept spare."""
    early = {"elapsed_s": 0, "node_replace_s": 86400, "spare_reserve": 2}
    assert decide(inputs(**early, spares_free=3)).action == Action.RESTART
    at_reserve = decide(inputs(**early, spares_free=2))
    assert at_reserve.action == Action.FAILOVER
    assert at_reserve.costs_s["restart"] == pytest.approx(restart_cost_s(3600, 0, 600 + 86400, 30))
    unsaid = decide(inputs(**early))  # no count said: a spare is a spare
    assert unsaid.action == Action.RESTART
    no_path = decide(inputs(**early | {"elapsed_s": 3500}, spares_free=1, path_available=False))
    assert no_path.action == Action.RESTART
    assert no_path.costs_s["restart"] == pytest.approx(restart_cost_s(3600, 0, 600, 30))
    assert no_path.costs_s["restart"] < at_reserve.costs_s["restart"]  # type: ignore[operator]
    assert not spare_usable(False, None, 0, can_fail_over=False)
    assert spare_usable(True, 0, 0, can_fail_over=False)
    assert not spare_usable(True, 0, 0, can_fail_over=True)
    assert spare_usable(True, 1, 0, can_fail_over=True)


def test_healed_flap_needs_nothing() -> None:
    d = decide(inputs(elapsed_s=100, healed=True))
    assert d.action == Action.NONE
    assert d.costs_s["none"] == pytest.approx(3500)


def test_backup_only_fault_needs_nothing() -> None:
    d = decide(inputs(elapsed_s=100, affected=False))
    assert d.action == Action.NONE
    assert "backup" in d.reason


def test_overdue_checkpoint_is_capped_and_noted() -> None:
    d = decide(inputs(elapsed_s=5000))
    assert d.action == Action.FAILOVER
    assert d.costs_s["failover"] == pytest.approx(630)
    assert d.notes and "overdue" in d.notes[0]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("checkpoint_interval_s", 0, "checkpoint_interval_s"),
        ("k", 0.9, "k \\(slowdown"),
        ("elapsed_s", -1, "elapsed_s"),
        ("reload_s", math.inf, "reload_s"),
        ("gpus", 0, "gpus"),
        ("dp_size", 0, "dp_size"),
    ],
)
def test_bad_inputs_name_the_field(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        inputs(**{field: value})


@pytest.mark.parametrize(
    ("exp", "retry", "seconds"),
    [(14, 7, 4.096e-6 * 16384 * 8), (0, 0, 4.096e-6), (22, 7, 4.096e-6 * 2**22 * 8)],
)
def test_ib_timeout(exp: int, retry: int, seconds: float) -> None:
    assert ib_timeout_s(exp, retry) == pytest.approx(seconds)


@pytest.mark.parametrize(("exp", "retry"), [(32, 0), (-1, 0), (5, 8)])
def test_ib_timeout_rejects_out_of_range(exp: int, retry: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        ib_timeout_s(exp, retry)


@pytest.mark.parametrize(("faults", "k"), [(0, 1.0), (1, 1.03), (2, 1.20), (3, 1.50), (9, 1.50)])
def test_paper_default_k(faults: int, k: float) -> None:
    assert default_k(faults) == k


def test_k_sources_in_order_of_preference() -> None:
    measured = estimate_k(measured_k=1.1, comm_share=0.3, bandwidth_left=0.5, concurrent_faults=2)
    assert (measured.k, measured.source) == (1.1, KSource.MEASURED)
    model = estimate_k(measured_k=None, comm_share=0.3, bandwidth_left=0.5, concurrent_faults=2)
    assert model.source == KSource.MODEL
    assert model.k == pytest.approx(0.7 + 0.3 / 0.5)
    default = estimate_k(measured_k=None, comm_share=None, bandwidth_left=0.5, concurrent_faults=2)
    assert (default.k, default.source) == (1.20, KSource.DEFAULT)


def test_model_k_bounds() -> None:
    assert modelled_k(0.0, 0.1) == 1.0
    assert modelled_k(1.0, 0.5) == 2.0
    with pytest.raises(ValueError, match="comm_share"):
        modelled_k(1.5, 0.5)
    with pytest.raises(ValueError, match="bandwidth_left"):
        modelled_k(0.5, 0.0)
