"""The cluster at a glance: what the status page, GET /v1/status and the store gauges show.

One snapshot of the store feeds all three, so the page, the API and Prometheus
never disagree about which ports are broken or which jobs run failed over.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from scheduler_svc.api.schemas.faults import FaultOut
from scheduler_svc.api.schemas.status import (
    DecisionBriefOut,
    JobStatusOut,
    NodeStatusOut,
    RailCellOut,
    RailSummaryOut,
    StatusHealth,
    StatusOut,
    SwitchSummaryOut,
)
from scheduler_svc.engine.decision import total_saved_gpu_s
from scheduler_svc.engine.fabric import WHOLE_DEVICE, FaultHealth
from scheduler_svc.store import models as m
from scheduler_svc.store.commands import CommandRepo
from scheduler_svc.store.faults import FaultRepo
from scheduler_svc.store.jobs import DecisionRepo, JobRepo
from scheduler_svc.store.types import JobMode

# Far above any real number of open faults; the bound keeps one scrape cheap if it ever is not.
MAX_OPEN_FAULTS = 10_000


def _brief(d: m.Decision) -> DecisionBriefOut:
    inputs = d.inputs or {}
    return DecisionBriefOut(
        decision_id=d.decision_id,
        action=d.action,
        reason=d.reason,
        trigger=d.trigger,
        created_at=d.created_at,
        k=inputs.get("k"),
        k_source=inputs.get("k_source"),
        t_elapsed_s=inputs.get("t_elapsed_s"),
        threshold_s=inputs.get("threshold_s"),
        costs_s=d.costs_s,
        costs_gpu_s=d.costs_gpu_s,
    )


# A page of the node grid: 256 nodes of 8 rails is 2,048 cells.
NODE_PAGE = 256
NODE_PAGE_MAX = 2_000
# Switches listed with a port not ok; the counts of all of them are in by_rail.
MAX_SWITCHES = 1_000


@dataclass(frozen=True)
class StatusQuery:
    """Which nodes the snapshot lists (the summaries always cover the whole fabric).

    rail, switch: only the nodes with a port there, and only those ports of them;
    health "unhealthy": only nodes with a port (among those) not ok; then a page of
    `limit` nodes by name, after `after_node`.
    """

    rail: int | None = None
    switch: str | None = None
    health: StatusHealth = "all"
    after_node: str | None = None
    limit: int = NODE_PAGE


# The first page of every node, as the page at / shows it without parameters.
FIRST_PAGE = StatusQuery()


@dataclass(frozen=True)
class PortHealth:
    """One GPU-fabric RNIC port and what the store says of it."""

    node: str
    device: str
    port: int
    rail: int
    switch: str | None
    state: str
    health: Literal["ok", "fault", "down"]
    fault_kind: str | None

    def cell(self) -> RailCellOut:
        return RailCellOut(
            rail=self.rail,
            device=self.device,
            port=self.port,
            switch=self.switch,
            state=self.state,
            health=self.health,
            fault_kind=self.fault_kind,
        )


def port_health(
    session: Session, faults: Iterable[m.Fault], only: ColumnElement[bool] | None = None
) -> list[PortHealth]:
    """Every GPU-fabric port (storage and management NICs carry no GPU traffic), or those
    matching `only`, by node, rail, device and port; read as plain rows, since a fleet has
    8 per node."""
    by_port = {(f.node, f.device, f.port): f for f in faults}
    q = select(m.Rnic.node, m.Rnic.name, m.Rnic.port, m.Rnic.rail, m.Rnic.switch, m.Rnic.state)
    q = q.where(m.Rnic.rail.is_not(None))
    if only is not None:
        q = q.where(only)
    rows = session.execute(q.order_by(m.Rnic.node, m.Rnic.rail, m.Rnic.name, m.Rnic.port)).all()
    out = []
    for node, device, port, rail, switch, state in rows:
        fault = by_port.get((node, device, port)) or by_port.get((node, device, WHOLE_DEVICE))
        kind = None if fault is None else fault.kind
        health: Literal["ok", "fault", "down"] = (
            "fault" if fault is not None else "ok" if state == "ACTIVE" else "down"
        )
        out.append(PortHealth(node, device, port, rail, switch, state, health, kind))
    return out


def _counts(ports: Iterable[PortHealth]) -> dict[str, int]:
    c = Counter(p.health for p in ports)
    return {"ports": c.total(), "ok": c["ok"], "down": c["down"], "fault": c["fault"]}


def _by_rail(ports: Sequence[PortHealth]) -> list[RailSummaryOut]:
    rails: dict[int, list[PortHealth]] = defaultdict(list)
    for p in ports:
        rails[p.rail].append(p)
    return [
        RailSummaryOut(
            rail=rail,
            switches=len({p.switch for p in on if p.switch is not None}),
            **_counts(on),
        )
        for rail, on in sorted(rails.items())
    ]


def _switches(ports: Sequence[PortHealth]) -> tuple[list[SwitchSummaryOut], int]:
    """The switches with a port not ok, worst first, and how many switches there are."""
    switches: dict[str, list[PortHealth]] = defaultdict(list)
    for p in ports:
        if p.switch is not None:
            switches[p.switch].append(p)
    unhealthy = [
        SwitchSummaryOut(
            switch=name,
            rails=sorted({p.rail for p in on}),
            nodes=len({p.node for p in on}),
            **_counts(on),
        )
        for name, on in switches.items()
        if any(p.health != "ok" for p in on)
    ]
    unhealthy.sort(key=lambda sw: (-(sw.fault + sw.down), sw.switch))
    return unhealthy[:MAX_SWITCHES], len(switches)


def _node_page(
    nodes: Sequence[tuple[str, datetime]], ports: Sequence[PortHealth], q: StatusQuery
) -> tuple[list[NodeStatusOut], int, str | None]:
    """(this page of matching nodes, how many match, the next page's after_node)."""
    cells: dict[str, list[PortHealth]] = defaultdict(list)
    for p in ports:
        if (q.rail is None or p.rail == q.rail) and (q.switch is None or p.switch == q.switch):
            cells[p.node].append(p)
    page: list[NodeStatusOut] = []
    total = 0
    more = False
    for name, updated_at in nodes:
        mine = cells.get(name, [])
        if (q.rail is not None or q.switch is not None) and not mine:
            continue
        if q.health == "unhealthy" and all(p.health == "ok" for p in mine):
            continue
        total += 1
        if q.after_node is not None and name <= q.after_node:
            continue
        if len(page) == q.limit:
            more = True
            continue
        page.append(NodeStatusOut(name=name, updated_at=updated_at, rails=[p.cell() for p in mine]))
    return page, total, page[-1].name if more else None


def failed_over_since(job: m.Job, last_failover: Mapping[str, m.Decision]) -> datetime | None:
    """When a job that runs failed over did so (its newest failover decision), else None."""
    since = last_failover.get(job.job_id)
    if since is None or job.mode != JobMode.FAILED_OVER.value:
        return None
    return since.created_at


def build_status(session: Session, now: datetime, query: StatusQuery = FIRST_PAGE) -> StatusOut:
    """The cluster's status, its node grid one page of it; the caller's session is only
    read from."""
    faults = FaultRepo(session).all(open_only=True, limit=MAX_OPEN_FAULTS)
    ports = port_health(session, faults)
    nodes = (
        session.execute(select(m.Node.name, m.Node.updated_at).order_by(m.Node.name)).tuples().all()
    )
    page, matching, next_after = _node_page(nodes, ports, query)
    switches, switches_total = _switches(ports)
    decisions = DecisionRepo(session)
    latest = decisions.latest_per_job()
    last_failover = decisions.latest_per_job(action="failover")
    counts = JobRepo(session).rank_counts()
    jobs = []
    for job in JobRepo(session).all():
        ranks, on_nodes = counts.get(job.job_id, (0, []))
        newest = latest.get(job.job_id)
        jobs.append(
            JobStatusOut(
                job_id=job.job_id,
                mode=JobMode(job.mode),
                ranks=ranks,
                nodes=on_nodes,
                last_checkpoint_at=job.last_checkpoint_at,
                slowdown_k=job.slowdown_k,
                failed_over_since=failed_over_since(job, last_failover),
                latest_decision=None if newest is None else _brief(newest),
            )
        )
    saved = decisions.actions_and_saved()
    pending, oldest = CommandRepo(session).unacknowledged()
    return StatusOut(
        generated_at=now,
        rails=sorted({p.rail for p in ports}),
        by_rail=_by_rail(ports),
        switches=switches,
        switches_total=switches_total,
        nodes_registered=len(nodes),
        nodes_total=matching,
        nodes=page,
        next_after_node=next_after,
        open_faults=[fault_out(f) for f in faults],
        jobs=jobs,
        decisions_by_action=dict(Counter(action for action, _ in saved)),
        saved_gpu_seconds=total_saved_gpu_s(s for _, s in saved),
        commands_unacknowledged=pending,
        oldest_unacknowledged_at=oldest,
    )


def fault_out(f: m.Fault, health: FaultHealth | None = None) -> FaultOut:
    """A fault as the API shows it (port null when the whole RNIC failed)."""
    return FaultOut(
        id=f.id,
        node=f.node,
        device=f.device,
        port=f.port or None,
        kind=f.kind,
        opened_at=f.opened_at,
        switch=f.switch,
        cleared_at=f.cleared_at,
        resolved_at=f.resolved_at,
        resolved_reason=f.resolved_reason,
        resolved_by=f.resolved_by,
        last_error_at=f.last_error_at,
        health=None if health is None else health.health.value,
        clears_at=None if health is None else health.clears_at,
        evidence={"first_event_id": f.first_event_id, **(f.detail or {})},
    )
