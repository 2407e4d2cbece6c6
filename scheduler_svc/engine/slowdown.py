"""The slowdown factor k while a job runs failed over, and where it came from."""

from __future__ import annotations

import enum
from dataclasses import dataclass

# ReCCL §4.1 defaults by number of concurrent faults: one, two, three or more.
PAPER_DEFAULT_K: tuple[float, ...] = (1.03, 1.20, 1.50)


class KSource(enum.StrEnum):
    """Which estimate of k a decision used, best first."""

    MEASURED = "measured"
    MODEL = "model"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class SlowdownEstimate:
    k: float
    source: KSource
    detail: str


def default_k(concurrent_faults: int, table: tuple[float, ...] = PAPER_DEFAULT_K) -> float:
    """The paper's k for this many concurrent faults (the last entry covers "or more")."""
    if concurrent_faults < 1:
        return 1.0
    return table[min(concurrent_faults, len(table)) - 1]


def modelled_k(comm_share: float, bandwidth_left: float) -> float:
    """k from the share of step time spent communicating and the bandwidth fraction left.

    Collectives run at the pace of the slowest link, so the communication part
    stretches by 1/bandwidth_left while compute is unchanged (no overlap assumed,
    which makes this an upper bound).
    """
    if not 0.0 <= comm_share <= 1.0:
        raise ValueError(f"comm_share must be within [0, 1], got {comm_share}")
    if not 0.0 < bandwidth_left <= 1.0:
        raise ValueError(f"bandwidth_left must be within (0, 1], got {bandwidth_left}")
    return (1.0 - comm_share) + comm_share / bandwidth_left


def estimate_k(
    *,
    measured_k: float | None,
    comm_share: float | None,
    bandwidth_left: float | None,
    concurrent_faults: int,
    table: tuple[float, ...] = PAPER_DEFAULT_K,
) -> SlowdownEstimate:
    """Prefer a measured k, then the bandwidth model, then the paper's defaults."""
    if measured_k is not None:
        if measured_k < 1.0:
            raise ValueError(f"measured k must be >= 1, got {measured_k}")
        return SlowdownEstimate(measured_k, KSource.MEASURED, "measured by the job")
    if comm_share is not None and bandwidth_left is not None:
        k = modelled_k(comm_share, bandwidth_left)
        return SlowdownEstimate(
            k,
            KSource.MODEL,
            f"communication share {comm_share:.0%} at {bandwidth_left:.0%} of the bandwidth",
        )
    k = default_k(concurrent_faults, table)
    return SlowdownEstimate(
        k, KSource.DEFAULT, f"paper default for {concurrent_faults} concurrent fault(s)"
    )
