"""Which DP replicas a node holds, and the DP size left without some nodes."""

from __future__ import annotations

import pytest

from scheduler_svc.engine.layout import ScaledPlan, dp_replica, scaled_plan


def placed(nodes: int, gpus: int = 8) -> list[tuple[int, str, int]]:
    """Ranks numbered node by node, as the fleet managers place them."""
    return [(i * gpus + g, f"n{i}", g) for i in range(nodes) for g in range(gpus)]


def test_replica_of_a_rank_counts_tp_fastest_then_dp() -> None:
    # dp 4, tp 2, pp 2: ranks 0-1 replica 0, 2-3 replica 1, ... 8-9 replica 0 again.
    assert [dp_replica(r, 4, 2) for r in range(16)] == [0, 0, 1, 1, 2, 2, 3, 3] * 2


@pytest.mark.parametrize(
    ("layout", "drop", "plan"),
    [
        ((4, 8, 1), {"n1"}, ScaledPlan(("n1",), (1,), 4, 3)),
        ((4, 4, 2), {"n3"}, ScaledPlan(("n3",), (2, 3), 4, 2)),
        ((8, 2, 2), {"n0"}, ScaledPlan(("n0",), (0, 1, 2, 3), 8, 4)),
        # Two nodes of one pipeline (replica 0's stages) cost one replica.
        ((2, 8, 2), {"n0", "n2"}, ScaledPlan(("n0", "n2"), (0,), 2, 1)),
        ((2, 8, 2), {"n0", "n1"}, None),  # both replicas gone
        ((8, 2, 2), {"n0", "n3"}, None),  # n0 and n3 hold replicas 0-3 and 4-7
        ((8, 1, 1), {"n0"}, None),  # 8 x 1 x 1 is not the 32 ranks
        # 16 x 1 x 1 is not the 32 ranks either, though dropping n0 would leave 8.
        ((16, 1, 1), {"n0"}, None),
        ((4, 8, 1), set(), None),  # nothing to drop
        ((4, 8, 1), {"n9"}, None),  # a node the job does not use
    ],
)
def test_scaled_plan(layout: tuple[int, int, int], drop: set[str], plan: ScaledPlan | None) -> None:
    dp, tp, pp = layout
    assert scaled_plan(placed(4), drop, dp_size=dp, tp_size=tp, pp_size=pp) == plan
