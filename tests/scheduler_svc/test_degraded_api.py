"""Degradation as evidence over the real HTTP API, on SQLite and PostgreSQL (issue 31):
a port at half its rate rebalances a running 16-GPU job's channels, never fails it over,
and the restored rate returns even weights after the quiet period; a PCIe link at x8 and
rising symbol errors each open one degraded fault whose figure the decision names.

The service runs on a clock the test moves; the coordinator's sweep reads the same clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx

from railover_testing.local import ManualClock
from tests.scheduler_svc.helpers import register_nodes
from tests.scheduler_svc.sequences import ev, post
from tests.scheduler_svc.test_fault_lifecycle_api import (
    T0,
    commands,
    decisions,
    make,
    start_job,
    wait_for,
)

__all__ = ["make"]  # the fixture, shared with the fault lifecycle tests

QUIET_S = 300  # the make fixture's fault_quiet_s


def degraded_faults(http: httpx.Client) -> list[dict[str, Any]]:
    listed = http.get("/v1/faults?open=true").json()["faults"]
    return [f for f in listed if f["kind"] == "degraded"]


def rate(at_s: float, gbps: float, device: str = "mlx5_3") -> dict[str, Any]:
    return ev("n0", "port_rate", T0 + timedelta(seconds=at_s), device=device, rate_gbps=gbps)


def test_half_the_rate_rebalances_every_rank_at_one_switch_point_and_the_restored_rate_evens_them(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]],
) -> None:
    http, clock, _ = make()
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"])
    out = post(http, rate(0, 200))
    assert out["faults_opened"] == 1
    (d,) = decisions(http, "j")
    assert d["action"] == "rebalance"
    assert d["reason"].startswith("n0/mlx5_3/1 at 200 of 400 Gb/s (port rate)")
    told = commands(http, "j", "balance")
    # One switch point for the communicator: every rank, one epoch and op count.
    assert sorted(r for c in told for r in c["ranks"]) == list(range(16))
    assert len({(c["epoch"], c["ops_done"], c["comm_id"]) for c in told}) == 1
    w = told[0]["channel_weights"]
    assert all(c["channel_weights"] == w for c in told)
    assert math.isclose(math.fsum(w), 1.0)
    # mlx5_3 carries channels 3 and 11: half its former eighth.
    assert math.isclose(w[3] + w[11], 0.5 / 8)
    assert not commands(http, "j", "failover")
    # A late report of the old rate, observed before the new one, changes nothing.
    clock.advance(10)
    post(http, rate(-5, 400))
    assert len(decisions(http, "j")) == 1
    assert len(degraded_faults(http)) == 1
    # Restored at 20 s: the weights hold through the quiet period, then return to even.
    clock.advance(10)
    post(http, rate(20, 400))
    assert len(decisions(http, "j")) == 1
    clock.advance(QUIET_S + 5)
    wait_for(lambda: len(decisions(http, "j")) == 2)
    back = decisions(http, "j")[0]
    assert back["action"] == "rebalance" and "even share" in back["reason"]
    even = [c for c in commands(http, "j", "rebalance") if c["decision_id"] == back["decision_id"]]
    assert sorted(r for c in even for r in c["ranks"]) == list(range(16))
    assert all(c["channel_weights"] == [] and c["disabled_channels"] == [] for c in even)
    assert not degraded_faults(http)


def test_pcie_at_x8_and_rising_symbol_errors_each_open_one_degraded_fault_named_by_its_figure(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]],
) -> None:
    http, clock, _ = make(degraded_counter_limits=("symbol_error=10",), degraded_window_s=60)
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"])
    pcie = {"current_width": 8, "max_width": 16, "current_speed_gts": 32.0, "max_speed_gts": 32.0}
    assert (
        post(http, ev("n0", "pcie_degraded", T0, device="mlx5_1", detail=pcie))["faults_opened"]
        == 1
    )
    first = decisions(http, "j")[0]
    assert first["action"] == "rebalance"
    assert "n0/mlx5_1 PCIe x8 at 32 GT/s of x16 at 32 GT/s" in first["reason"]
    # Symbol errors on mlx5_5: 6, then 6 more within the minute, over the limit of 10.
    clock.advance(5)
    errors = [
        ev(
            "n0",
            "counter",
            T0 + timedelta(seconds=s),
            device="mlx5_5",
            counter="symbol_error",
            delta=6,
        )
        for s in (1, 4)
    ]
    assert post(http, errors[0])["faults_opened"] == 0
    assert post(http, errors[1])["faults_opened"] == 1
    latest = decisions(http, "j")[0]
    assert latest["action"] == "rebalance"
    assert "n0/mlx5_5/1 symbol_error +12 in 60 s (limit 10)" in latest["reason"]
    assert sorted(f["device"] for f in degraded_faults(http)) == ["mlx5_1", "mlx5_5"]
    assert not commands(http, "j", "failover")
    # A link down on the degraded port fails it over: the failure takes the fault's place.
    clock.advance(5)
    post(http, ev("n0", "port_down", T0 + timedelta(seconds=10), device="mlx5_5"))
    assert decisions(http, "j")[0]["action"] == "failover"
    assert [f["device"] for f in degraded_faults(http)] == ["mlx5_1"]
