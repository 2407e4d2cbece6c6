"""Which data-parallel replicas a node holds, and what DP size is left without some nodes.

A job's ranks are numbered the way Megatron-LM and torchtitan number them by
default: tensor parallel fastest, then data parallel, then pipeline parallel,

    rank = pp_index · (dp · tp) + dp_index · tp + tp_index,

so the DP replica of a rank is ``(rank // tp) % dp``. A replica is every rank
with one dp_index (all its TP and PP stages). Dropping a node drops every
replica with a rank on it; the job restarts with the replicas that are left.
Pure: no I/O, the placement is an argument.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScaledPlan:
    """Restart without `drop_nodes`: `dropped_replicas` go, `new_dp_size` replicas remain."""

    drop_nodes: tuple[str, ...]
    dropped_replicas: tuple[int, ...]
    dp_size: int
    new_dp_size: int


def dp_replica(rank: int, dp_size: int, tp_size: int) -> int:
    """The data-parallel replica rank `rank` belongs to (TP fastest, then DP, then PP)."""
    return (rank // tp_size) % dp_size


def layout_fits(ranks: int, dp_size: int, tp_size: int, pp_size: int) -> bool:
    """Whether DP·TP·PP names every rank once; only then does a rank have a replica."""
    return dp_size * tp_size * pp_size == ranks


def scaled_plan(
    placement: Iterable[tuple[int, str, int]],
    drop_nodes: Collection[str],
    *,
    dp_size: int,
    tp_size: int,
    pp_size: int,
) -> ScaledPlan | None:
    """The DP size left once `drop_nodes` go; None when nothing would be left to run.

    `placement` is (rank, node, gpu) per rank. None too when the layout does not
    describe the ranks (DP·TP·PP is not their number) or the nodes hold no rank.
    """
    ranks = list(placement)
    if not drop_nodes or not layout_fits(len(ranks), dp_size, tp_size, pp_size):
        return None
    gone = sorted({dp_replica(r, dp_size, tp_size) for r, node, _ in ranks if node in drop_nodes})
    left = dp_size - len(gone)
    if not gone or left < 1:
        return None
    return ScaledPlan(tuple(sorted(drop_nodes)), tuple(gone), dp_size, left)
