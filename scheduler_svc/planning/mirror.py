"""FlowCheck capture planning: how many ranks of a DP ring to mirror, and which.

FlowCheck rebuilds each iteration's gradients from allreduce traffic that the
switches mirror to checkpoint nodes. Mirror links cannot retransmit, so with
per-packet loss p, K gradient packets per iteration, DP size N and M monitored
ranks an iteration cannot be rebuilt with probability

    P_fail(M) = 1 − (1 − p^(M−1))^(K·M/N) · (1 − p^M)^(K·(N−M)/N).

Written as −expm1(K·M/N·log1p(−p^(M−1)) + K·(N−M)/N·log1p(−p^M)) with
p^M = exp(M·ln p), it keeps full relative precision when p^M is far below
1e-16, where the textbook form cancels to exactly zero.

Placement model: rank i of the ring leaves on rail i mod R (the ring is
striped over the node's rails) and shares a ToR with the other ranks of its
rail in blocks of ``--ranks-per-switch``: switch (i mod R, ⌊⌊i/R⌋ / S⌋).
Monitors are spread evenly round the ring (the coverage the formula assumes)
and each is moved to the nearest rank whose switch, and if possible rail, no
other monitor uses, so a single switch failure takes out at most one monitor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from scheduler_svc.planning.params import MirrorParams

F64 = NDArray[np.float64]


def p_fail(loss: float, dp: int, packets: int, monitors: NDArray[np.int64] | None = None) -> F64:
    """P_fail(M) for M in `monitors` (default 1..dp), accurate for tiny loss."""
    m = np.arange(1, dp + 1, dtype=np.float64) if monitors is None else monitors.astype(np.float64)
    if loss == 0.0:
        # 0^0 = 1: a single monitor leaves some packets with no copy at all.
        return np.where(m == 1, 1.0, 0.0)
    log_p = np.log(loss)
    p_m_minus_1 = np.exp((m - 1.0) * log_p)
    p_m = np.exp(m * log_p)
    with np.errstate(divide="ignore"):  # log1p(−1) = −inf is the M = 1 case: certain failure
        log_ok = (packets * m / dp) * np.log1p(-p_m_minus_1) + (packets * (dp - m) / dp) * np.log1p(
            -p_m
        )
    return np.asarray(-np.expm1(log_ok), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Monitor:
    rank: int
    rail: int
    switch: str
    shares_switch: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "rail": self.rail,
            "switch": self.switch,
            "shares_switch": self.shares_switch,
        }


@dataclass(frozen=True, slots=True)
class MirrorPlan:
    params: MirrorParams
    p_fail: F64
    failed_per_year: F64
    recommended: int | None
    placement: list[Monitor]

    def as_json(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "loss": self.params.loss,
            "dp": self.params.dp,
            "packets": self.params.packets,
            "target": self.params.target,
            "iteration_s": self.params.iteration_s,
            "rails": self.params.rails,
            "ranks_per_switch": self.params.ranks_per_switch,
            "iterations_per_year": self.params.iterations_per_year,
        }
        return {
            "parameters": params,
            "p_fail": {str(i + 1): float(v) for i, v in enumerate(self.p_fail)},
            # The table's third column: p_fail × iterations per year.
            "failed_per_year": {str(i + 1): float(v) for i, v in enumerate(self.failed_per_year)},
            "recommended_monitors": self.recommended,
            "placement": [m.as_json() for m in self.placement],
        }


def switch_of(rank: int, rails: int, ranks_per_switch: int) -> tuple[int, int]:
    """(rail, switch index on that rail) of a ring rank in the striped layout."""
    return rank % rails, (rank // rails) // ranks_per_switch


def place(dp: int, monitors: int, rails: int, ranks_per_switch: int) -> list[Monitor]:
    """Spread `monitors` ranks evenly on the ring, on distinct switches (and rails) if possible."""
    ranks = np.arange(dp)
    rail = ranks % rails
    switch_id = rail * dp + (ranks // rails) // ranks_per_switch
    used_switch: set[int] = set()
    used_rail: set[int] = set()
    chosen: list[int] = []
    taken = np.zeros(dp, dtype=np.bool_)
    for j in range(monitors):
        target = round(j * dp / monitors) % dp
        ring_distance = np.minimum(np.abs(ranks - target), dp - np.abs(ranks - target))
        # Lexicographic: free switch first, then free rail, then closeness to the even spot.
        score = (
            np.isin(switch_id, list(used_switch)) * (4 * dp)
            + np.isin(rail, list(used_rail)) * (2 * dp)
            + ring_distance
        ) + taken * (16 * dp)
        pick = int(np.argmin(score))
        chosen.append(pick)
        taken[pick] = True
        used_switch.add(int(switch_id[pick]))
        used_rail.add(int(rail[pick]))
    out = []
    counts: dict[tuple[int, int], int] = {}
    for rank in chosen:
        key = switch_of(rank, rails, ranks_per_switch)
        counts[key] = counts.get(key, 0) + 1
    for rank in sorted(chosen):
        r, s = switch_of(rank, rails, ranks_per_switch)
        out.append(Monitor(rank, r, f"rail{r}-sw{s}", counts[(r, s)] > 1))
    return out


def plan(params: MirrorParams) -> MirrorPlan:
    """P_fail for every M, the smallest M meeting the yearly target, and where to put them."""
    probs = p_fail(params.loss, params.dp, params.packets)
    per_year = probs * params.iterations_per_year
    meets = np.nonzero(per_year <= params.target)[0]
    recommended = int(meets[0]) + 1 if meets.size else None
    placement = (
        place(params.dp, recommended, params.rails, params.ranks_per_switch)
        if recommended is not None
        else []
    )
    return MirrorPlan(params, probs, per_year, recommended, placement)
