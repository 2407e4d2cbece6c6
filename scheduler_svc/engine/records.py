"""What a decision stores beside its reason: the inputs it rests on and its plan.

`inputs_record` is the record of a cost decision's inputs, `inputs_now` that of a
decision the cost model did not make (fail-back, checkpoint, replan); `cost_plan` and
`moved_plan` are the plan a decision shows: who moved where, what failed, the
bandwidth left.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from scheduler_svc.engine import decision as cost
from scheduler_svc.engine.fabric import Unhealthy
from scheduler_svc.engine.jobindex import odd_routes
from scheduler_svc.engine.routes import Connectivity
from scheduler_svc.engine.state import JobState, Options, usable_checkpoint_at


def inputs_record(result: cost.Decision, concurrent: int) -> dict[str, Any]:
    """The stored (and returned) record of what a cost decision was based on."""
    i = result.inputs
    return {
        "t_elapsed_s": i.elapsed_s,
        "checkpoint_interval_s": i.checkpoint_interval_s,
        "k": i.k,
        "k_source": i.k_source,
        "detect_s": i.detect_s,
        "reload_s": i.reload_s,
        "timeout_s": i.timeout_s,
        "threshold_s": result.threshold_s,
        "gpus": i.gpus,
        "concurrent_faults": concurrent,
        "path_available": i.path_available,
        "dp_size": i.dp_size,
        "new_dp_size": i.new_dp_size,
        "allow_scaling": i.allow_scaling,
        "spare_nodes": i.spare_nodes,
        "spares_free": i.spares_free,
        "spare_reserve": i.spare_reserve,
        "node_replace_s": i.node_replace_s,
        "spare_price_s": i.spare_price_s,
        "planned": i.planned,
    }


def inputs_now(
    at: datetime, job: JobState, options: Options, k_used: float | None
) -> dict[str, Any]:
    """The inputs record of a decision the cost model did not make (fail-back, checkpoint)."""
    k = job.measured_k if job.measured_k is not None else job.slowdown_k
    k = k if k is not None else k_used
    known = k is not None
    k = k if k is not None else options.default_k[0]
    return {
        "t_elapsed_s": max(0.0, (at - usable_checkpoint_at(job)).total_seconds()),
        "checkpoint_interval_s": job.checkpoint_interval_s,
        "k": k,
        "k_source": "measured" if known else "default",
        "detect_s": job.detect_s,
        "reload_s": job.reload_s,
        "timeout_s": job.timeout_s,
        "threshold_s": cost.failover_threshold_s(job.checkpoint_interval_s, job.detect_s, k),
        "gpus": len(job.ranks),
    }


def moved_plan(conn: Connectivity) -> list[dict[str, Any]]:
    return [
        {"rank": r.rank, "node": r.node, "gpu": r.gpu, "from": r.primary, "to": r.backup}
        for r in odd_routes(conn)
        if not r.primary_ok and r.backup_ok
    ]


def cost_plan(
    conn: Connectivity,
    bw: float | None,
    k_detail: str,
    result: cost.Decision,
    *,
    evidence: Sequence[Unhealthy],
    warnings: tuple[str, ...],
) -> dict[str, Any]:
    return {
        "mitigation": "s-bond",
        "failed_over": moved_plan(conn),
        "isolated_ranks": list(conn.isolated_ranks),
        "broken_pairs": conn.broken_pairs,
        "example_broken_pairs": [list(p) for p in conn.examples],
        "bandwidth_left": None if bw is None else round(bw, 4),
        "k_detail": k_detail,
        "failed_components": [
            {
                "node": u.node,
                "device": u.device,
                "port": u.port or None,
                "kind": u.kind,
                "component": u.label,
                "evidence": u.key,
            }
            for u in evidence
        ],
        "warnings": list(warnings),
        "notes": list(result.notes),
    }
