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

With ``--job ID`` the layout is not modelled but read: the job's DP ring (the
ranks of pipeline stage 0 and tensor rank 0, ranks ordered TP fastest, then DP,
then PP) and each ring rank's primary RNIC, its rail and its switch as the
service planned them. N is the job's dp_size, and the same spreading rule picks
the monitors on that real map.
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
    rank: int  # position on the DP ring (with a job: also its rank there, see job_rank)
    rail: int | None
    switch: str
    shares_switch: bool
    # Read from a registered job: the rank in the job, its node and primary RNIC.
    job_rank: int | None = None
    node: str | None = None
    rnic: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "rail": self.rail,
            "switch": self.switch,
            "shares_switch": self.shares_switch,
        }
        if self.job_rank is not None:
            out |= {"job_rank": self.job_rank, "node": self.node, "rnic": self.rnic}
        return out


@dataclass(frozen=True, slots=True)
class RingRank:
    """One rank of a registered job's DP ring, where its traffic leaves."""

    rank: int
    node: str
    rnic: str | None  # primary "mlx5_3/1"; None when the node registered no usable one
    rail: int | None
    switch: str | None


@dataclass(frozen=True, slots=True)
class JobLayout:
    """What `mirror-plan --job` reads from the service about one job."""

    job_id: str
    dp: int
    tp: int
    pp: int
    ring: tuple[RingRank, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "dp": self.dp,
            "tp": self.tp,
            "pp": self.pp,
            "ring": [
                {"rank": r.rank, "node": r.node, "rnic": r.rnic, "rail": r.rail, "switch": r.switch}
                for r in self.ring
            ],
        }


def dp_ring(dp: int, tp: int, pp: int, ranks: int) -> list[int]:
    """Ranks of the first DP ring (PP stage 0, TP rank 0), Megatron's order: TP fastest."""
    if dp * tp * pp != ranks:
        raise ValueError(
            f"dp×tp×pp = {dp}×{tp}×{pp} = {dp * tp * pp}, but the job has {ranks} ranks"
        )
    return [d * tp for d in range(dp)]


@dataclass(frozen=True, slots=True)
class MirrorPlan:
    params: MirrorParams
    p_fail: F64
    failed_per_year: F64
    recommended: int | None
    placement: list[Monitor]
    job: JobLayout | None = None

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
        out: dict[str, Any] = {
            "parameters": params,
            "p_fail": {str(i + 1): float(v) for i, v in enumerate(self.p_fail)},
            # The table's third column: p_fail × iterations per year.
            "failed_per_year": {str(i + 1): float(v) for i, v in enumerate(self.failed_per_year)},
            "recommended_monitors": self.recommended,
            "placement": [m.as_json() for m in self.placement],
        }
        if self.job is not None:
            # The invented layout's knobs play no part in a real job's placement.
            del params["rails"], params["ranks_per_switch"]
            out["job"] = self.job.as_json()
        return out


def switch_of(rank: int, rails: int, ranks_per_switch: int) -> tuple[int, int]:
    """(rail, switch index on that rail) of a ring rank in the striped layout."""
    return rank % rails, (rank // rails) // ranks_per_switch


def place(dp: int, monitors: int, rails: int, ranks_per_switch: int) -> list[Monitor]:
    """Spread `monitors` ranks evenly on the ring, on distinct switches (and rails) if possible."""
    ranks = np.arange(dp)
    rail = ranks % rails
    switch_id = rail * dp + (ranks // rails) // ranks_per_switch
    chosen = _spread(dp, monitors, rail, switch_id)
    out = []
    counts: dict[tuple[int, int], int] = {}
    for rank in chosen:
        key = switch_of(rank, rails, ranks_per_switch)
        counts[key] = counts.get(key, 0) + 1
    for rank in sorted(chosen):
        r, s = switch_of(rank, rails, ranks_per_switch)
        out.append(Monitor(rank, r, f"rail{r}-sw{s}", counts[(r, s)] > 1))
    return out


def place_on(ring: tuple[RingRank, ...], monitors: int) -> list[Monitor]:
    """The same spreading rule on a job's real ring: its ranks' own rails and switches.

    A rank whose switch is not known counts as alone on its own switch (nothing says
    it shares one), and one whose rail is not known as alone on its rail.
    """
    dp = len(ring)
    switch_names = [r.switch or f"?{i}" for i, r in enumerate(ring)]
    rail_names = [str(r.rail) if r.rail is not None else f"?{i}" for i, r in enumerate(ring)]
    switch_id = np.array([sorted(set(switch_names)).index(n) for n in switch_names])
    rail = np.array([sorted(set(rail_names)).index(n) for n in rail_names])
    chosen = _spread(dp, monitors, rail, switch_id)
    per_switch = {n: sum(switch_names[i] == n for i in chosen) for n in switch_names}
    return [
        Monitor(
            pos,
            ring[pos].rail,
            ring[pos].switch or "unknown",
            ring[pos].switch is not None and per_switch[switch_names[pos]] > 1,
            job_rank=ring[pos].rank,
            node=ring[pos].node,
            rnic=ring[pos].rnic,
        )
        for pos in sorted(chosen)
    ]


def _spread(
    dp: int, monitors: int, rail: NDArray[np.int64], switch_id: NDArray[np.int64]
) -> list[int]:
    """Ring positions for `monitors`: evenly round the ring, on the least-used switch first,
    then the least-used rail (so that, once every switch has one, they share evenly)."""
    ranks = np.arange(dp)
    on_switch = np.zeros(dp, dtype=np.int64)  # monitors on each rank's switch so far
    on_rail = np.zeros(dp, dtype=np.int64)
    chosen: list[int] = []
    taken = np.zeros(dp, dtype=np.bool_)
    for j in range(monitors):
        target = round(j * dp / monitors) % dp
        ring_distance = np.minimum(np.abs(ranks - target), dp - np.abs(ranks - target))
        # Lexicographic: fewest monitors on the switch, then on the rail, then closeness
        # to the even spot; a rank already chosen never again.
        score = (
            on_switch * (4 * dp * (monitors + 1)) + on_rail * (2 * dp) + ring_distance
        ) + taken * (16 * dp * (monitors + 1) ** 2)
        pick = int(np.argmin(score))
        chosen.append(pick)
        taken[pick] = True
        on_switch += switch_id == switch_id[pick]
        on_rail += rail == rail[pick]
    return chosen


def plan(params: MirrorParams, job: JobLayout | None = None) -> MirrorPlan:
    """P_fail for every M, the smallest M meeting the yearly target, and where to put them.

    With `job`, the monitors go on its real ring (params.dp is its dp_size).
    """
    if job is not None and len(job.ring) != params.dp:
        raise ValueError(f"the job's ring has {len(job.ring)} ranks, params.dp is {params.dp}")
    probs = p_fail(params.loss, params.dp, params.packets)
    per_year = probs * params.iterations_per_year
    meets = np.nonzero(per_year <= params.target)[0]
    recommended = int(meets[0]) + 1 if meets.size else None
    placement: list[Monitor] = []
    if recommended is not None:
        placement = (
            place_on(job.ring, recommended)
            if job is not None
            else place(params.dp, recommended, params.rails, params.ranks_per_switch)
        )
    return MirrorPlan(params, probs, per_year, recommended, placement, job)
