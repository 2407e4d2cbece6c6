"""Node registration and topology."""

from __future__ import annotations

from scheduler_svc.api import routing
from scheduler_svc.api.deps import AgentAuth, NodeReader, NowDep, Reader, SessionDep, SettingsDep
from scheduler_svc.api.schemas.fields import Name
from scheduler_svc.api.schemas.nodes import GpuIn, GpuPathOut, NodeIn, NodeOut, RnicIn
from scheduler_svc.errors import VALIDATION, Forbidden, NotFound, Unauthorized, responses
from scheduler_svc.services import node_plans, registry
from scheduler_svc.store import models as m

router = routing.router(prefix="/v1/nodes", tags=["nodes"])


def node_out(node: m.Node, backup_cap: int | None) -> NodeOut:
    """The node with the plan stored when it registered (services/node_plans.py)."""
    plan = node_plans.served(node, backup_cap)
    return NodeOut(
        name=node.name,
        registered_at=node.registered_at,
        updated_at=node.updated_at,
        topology_version=node.topology_version,
        gpus=[GpuIn.model_validate(g, from_attributes=True) for g in node.gpus],
        rnics=[RnicIn.model_validate(r, from_attributes=True) for r in node.rnics],
        backup_plan=[GpuPathOut.model_validate(g) for g in plan["gpus"]],
        warnings=list(plan["warnings"]),
    )


@router.put(
    "/{node}",
    operation_id="register_node",
    responses=responses(Unauthorized, Forbidden) | VALIDATION,
)
def register_node(
    node: Name,
    *,
    body: NodeIn,
    session: SessionDep,
    who: AgentAuth,
    settings: SettingsDep,
    now: NowDep,
) -> NodeOut:
    """Register or replace a node's topology (GPUs, RNIC ports, PCIe and fabric placement);
    a GPU or RNIC a job used that is missing now is a fault on it."""
    who.require_node(node)
    row = registry.register_node(session, node, body, now, settings)
    return node_out(row, settings.backup_cap_per_switch)


@router.get("", operation_id="list_nodes", responses=responses(Unauthorized, Forbidden))
def list_nodes(session: SessionDep, _: Reader, settings: SettingsDep) -> list[NodeOut]:
    """All registered nodes with their backup plans."""
    return [node_out(n, settings.backup_cap_per_switch) for n in registry.list_nodes(session)]


@router.get(
    "/{node}", operation_id="get_node", responses=responses(Unauthorized, Forbidden, NotFound)
)
def get_node(node: Name, session: SessionDep, who: NodeReader, settings: SettingsDep) -> NodeOut:
    """One node's topology and the s-Bond backup plan the service derives from it (an agent
    token reads its own node only)."""
    who.require_node(node)
    return node_out(registry.get_node(session, node), settings.backup_cap_per_switch)
