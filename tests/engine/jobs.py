"""What several engine tests start from: the job (named "j", running normally, an hour
between checkpoints with the last at T0, 600 s to reload and 30 s of timeout), and a
rail-optimised node."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from scheduler_svc.engine.paths import Gpu, NodeTopology, Rnic
from scheduler_svc.engine.state import JobState, Mode

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def a_job(ranks: tuple[tuple[int, str, int], ...], **fields: Any) -> JobState:
    """That job on `ranks` ((rank, node, gpu) each), with `fields` of JobState set (or
    replaced: `mode=Mode.FAILED_OVER`, say) too."""
    defaults: dict[str, Any] = {
        "job_id": "j",
        "mode": Mode.NORMAL,
        "checkpoint_interval_s": 3600.0,
        "reload_s": 600.0,
        "detect_s": 0.0,
        "timeout_s": 30.0,
        "last_checkpoint_at": T0,
    }
    return JobState(ranks=ranks, **(defaults | fields))


def rail_optimised(name: str, size: int) -> NodeTopology:
    """GPU i beside RNIC i on rail i, two per PCIe switch: backups on a neighbour's rail."""
    gpus = tuple(Gpu(i, f"g{i}", i // 2, f"p{i // 2}", f"rc{i // 2}", True) for i in range(size))
    rnics = tuple(
        Rnic(f"mlx5_{i}", 1, "", i // 2, f"p{i // 2}", f"rc{i // 2}", 400.0, f"leaf{i}", i)
        for i in range(size)
    )
    return NodeTopology(name, gpus, rnics)
