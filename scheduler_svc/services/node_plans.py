"""A node's backup plan as node reads serve it: computed once, when the node registers.

Every GET /v1/nodes recomputed every node's plan (1.9 s a call for one node of 1,024 GPUs
and 1,024 RNICs). Registration stores it with the topology version and PCIe-switch cap
it was computed for; a read serves it while both still hold, and computes it (without
storing: reads do not write) for a node registered before the plan was kept, or after
RAILOVER_BACKUP_CAP_PER_SWITCH changed.
"""

from __future__ import annotations

from typing import Any

from scheduler_svc.engine.paths import plan_node
from scheduler_svc.services.fabric import node_topology
from scheduler_svc.store import models as m

PATH_FIELDS = (
    "gpu",
    "primary",
    "backup",
    "primary_cost",
    "backup_cost",
    "primary_switch",
    "backup_switch",
)


def compute(node: m.Node, backup_cap: int | None) -> dict[str, Any]:
    """The plan as stored: each GPU's paths, the warnings, and what it was computed for."""
    plan = plan_node(node_topology(node), backup_cap)
    return {
        "topology_version": node.topology_version,
        "backup_cap": backup_cap,
        "gpus": [
            {**{f: getattr(g, f) for f in PATH_FIELDS}, "rail_disjoint": g.rail_disjoint}
            for g in plan.gpus
        ],
        "warnings": list(plan.warnings),
    }


def store(node: m.Node, backup_cap: int | None) -> None:
    """Keep the plan of the topology just registered (an unchanged one keeps its plan)."""
    kept = node.plan
    if kept is None or not _current(kept, node, backup_cap):
        node.plan = compute(node, backup_cap)


def served(node: m.Node, backup_cap: int | None) -> dict[str, Any]:
    """The stored plan while it is the node's current one; else computed now."""
    kept = node.plan
    if kept is not None and _current(kept, node, backup_cap):
        return kept
    return compute(node, backup_cap)


def _current(kept: dict[str, Any], node: m.Node, backup_cap: int | None) -> bool:
    return kept.get("topology_version") == node.topology_version and (
        kept.get("backup_cap") == backup_cap
    )
