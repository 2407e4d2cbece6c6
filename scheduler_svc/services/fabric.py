"""The fabric as evidence: read it from the store for the engine, and close what has cleared."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy.orm import Session, SessionTransaction

from scheduler_svc.config import Settings
from scheduler_svc.engine import fabric as health
from scheduler_svc.engine.paths import Gpu, NodePlan, NodeTopology, Rnic, plan_node
from scheduler_svc.engine.state import FabricView
from scheduler_svc.services import degradation
from scheduler_svc.store import evidence_view
from scheduler_svc.store import models as m
from scheduler_svc.store.faults import FaultRepo, OpenFault
from scheduler_svc.store.maintenance import MaintenanceRepo
from scheduler_svc.store.nodes import ACTIVE, NodeRepo
from scheduler_svc.store.uow import after_commit

LOST_KINDS = (health.FaultKind.GPU_LOST.value, health.FaultKind.RNIC_LOST.value)


def rules(settings: Settings) -> health.ClearingRules:
    return health.ClearingRules(
        damping_s=settings.failback_damping_s, quiet_s=settings.fault_quiet_s
    )


def node_topology(node: m.Node, lost: Sequence[OpenFault] = ()) -> NodeTopology:
    """A node's topology, with the GPUs and RNICs it lost kept in as failed "ghosts".

    A job was placed on the topology it had; planning on what is left would move
    its ranks silently to other RNICs. Kept in, the lost parts are faults like any
    other, and the decision names them.
    """
    gpus = [Gpu(g.index, g.pci, g.numa, g.pcie_switch, g.root_complex, g.nvlink) for g in node.gpus]
    rnics = [
        Rnic(
            r.name,
            r.port,
            r.pci,
            r.numa,
            r.pcie_switch,
            r.root_complex,
            r.rate_gbps,
            r.switch,
            r.rail,
            r.state,
            r.kind,
            r.physfn,
            tuple(r.members or ()),
        )
        for r in node.rnics
    ]
    return _with_lost(node.name, gpus, rnics, lost)


def topology_of(
    name: str,
    rows: tuple[list[Any], list[Any]],
    lost: Sequence[OpenFault] = (),
    parts: dict[tuple[Any, ...], Any] | None = None,
) -> NodeTopology:
    """`node_topology` from the node's plain GPU and RNIC rows (NodeRepo.topology_rows).

    `parts`, shared across nodes, hands out one Gpu or Rnic per distinct row: a fleet's
    nodes are mostly alike, and equal parts that are one object compare at once.
    """
    parts = {} if parts is None else parts
    gpus = [parts.get(("g", *r)) or parts.setdefault(("g", *r), Gpu(*r)) for r in rows[0]]
    rnics = [parts.get(("r", *r)) or parts.setdefault(("r", *r), Rnic(*r)) for r in rows[1]]
    return _with_lost(name, gpus, rnics, lost)


def _with_lost(
    name: str, gpus: list[Gpu], rnics: list[Rnic], lost: Sequence[OpenFault]
) -> NodeTopology:
    have_gpus = {g.index for g in gpus}
    have_rnics = {(r.name, r.port) for r in rnics}
    for f in lost:
        was: dict[str, Any] = dict(f.detail.get("was") or {})
        if f.kind == health.FaultKind.GPU_LOST and f.port not in have_gpus and was:
            gpus.append(Gpu(**was))
            have_gpus.add(f.port)
        elif f.kind == health.FaultKind.RNIC_LOST:
            for row in f.detail.get("ports") or []:
                key = (row["name"], row["port"])
                if key not in have_rnics:
                    rnics.append(Rnic(**{**row, "members": tuple(row.get("members") or ())}))
                    have_rnics.add(key)
    return NodeTopology(
        name=name,
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        rnics=tuple(sorted(rnics, key=lambda r: (r.name, r.port))),
    )


_Entry = tuple[NodeTopology, NodePlan]
_PENDING = "railover_plans_pending"  # session.info: plans made in its open transaction


class PlanCache:
    """Node topologies and s-Bond plans by (store, node, topology version, registration,
    losses, cap).

    A plan is a pure function of the topology, and a topology never changes under a
    version number of one registration (plus the set of lost parts kept in), so
    entries stay valid on every replica. Only committed ones, though: a transaction
    that rolls back can leave its key to another (a registration rolled back leaves its
    topology version to the node's next registration, which may be cabled another way;
    SQLite hands a rolled-back fault's id to the next fault). So a plan made inside a
    transaction is shared only once it commits; until then it serves that transaction
    alone, and not past a savepoint rolled back (store/groupcommit.py).
    """

    def __init__(self, max_entries: int = 50_000) -> None:
        self._entries: OrderedDict[tuple[object, ...], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_entries

    def get(
        self,
        session: Session,
        names: set[str],
        backup_cap: int | None,
        lost: dict[str, list[OpenFault]],
    ) -> tuple[dict[str, NodeTopology], dict[str, NodePlan]]:
        repo = NodeRepo(session)
        versions = repo.versions(names)
        # The store too: two stores in one process (tests, a migration tool) may each hold
        # a node of the same name, version and registration time, cabled differently.
        store = session.get_bind().engine.url.render_as_string(hide_password=True)
        keys = {
            name: (store, name, *stamp, tuple(f.id for f in lost.get(name, ())), backup_cap)
            for name, stamp in versions.items()
        }
        found: dict[str, _Entry] = {}
        with self._lock:
            for name, key in keys.items():
                hit = self._entries.get(key)
                if hit is not None:
                    self._entries.move_to_end(key)
                    found[name] = hit
        pending = _uncommitted(session)
        for name in versions.keys() - found.keys():
            for made in pending.values():
                if keys[name] in made:
                    found[name] = made[keys[name]]
                    break
        misses = [n for n in versions if n not in found]
        if misses:
            parts: dict[tuple[Any, ...], Any] = {}
            within = session.get_nested_transaction() or session.get_transaction()
            assert within is not None  # the version read above began one
            for name, rows in repo.topology_rows(misses).items():
                topo = topology_of(name, rows, lost.get(name, ()), parts)
                entry = (topo, plan_node(topo, backup_cap))
                found[name] = entry
                pending.setdefault(within, {})[keys[name]] = entry
                after_commit(session, partial(self._put, keys[name], entry))
        return {n: e[0] for n, e in found.items()}, {n: e[1] for n, e in found.items()}

    def keep(self, session: Session, node: m.Node, backup_cap: int | None) -> None:
        """Plan a node as it registers, under the key `get` reads it by, so that the first
        job placed on the fleet finds every plan made (unless some part of the node is lost:
        its plan then keeps the lost parts in, and is made when first asked for). Kept once
        the registration commits: a version rolled back may be registered again otherwise."""
        if any(f.kind in LOST_KINDS for f in FaultRepo(session).unresolved([node.name])):
            return
        store = session.get_bind().engine.url.render_as_string(hide_password=True)
        key = (store, node.name, node.topology_version, node.registered_at, (), backup_cap)
        topo = node_topology(node)
        entry = (topo, plan_node(topo, backup_cap))
        after_commit(session, lambda: self._put(key, entry))

    def _put(self, key: tuple[object, ...], entry: _Entry) -> None:
        with self._lock:
            self._entries[key] = entry
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)


PLANS = PlanCache()


def _uncommitted(session: Session) -> dict[SessionTransaction, dict[tuple[object, ...], _Entry]]:
    """The plans made in this session's transactions that are still open, by transaction;
    those of one committed or rolled back are forgotten (committed, the cache has them)."""
    pending: dict[SessionTransaction, dict[tuple[object, ...], _Entry]]
    pending = session.info.setdefault(_PENDING, {})
    for done in [t for t in pending if not t.is_active]:
        del pending[done]
    return pending


def _evidence_of(f: OpenFault) -> health.FaultEvidence:
    """A fault as the engine reads it, beside the level of the port it names (`state`
    None: no such port is registered, so nothing says it is down)."""
    state, since = f.state, f.observed_at
    if state is None:
        state, since = ACTIVE, None
    if f.kind == health.FaultKind.DEGRADED.value:
        return health.FaultEvidence(
            id=f.id,
            node=f.node,
            device=f.device,
            port=f.port,
            kind=health.FaultKind.DEGRADED,
            opened_at=f.opened_at,
            last_error_at=f.last_error_at,
            port_active=state == ACTIVE,
            port_since=since,
            switch=f.switch,
            **degradation.evidence_fields(f.detail),
        )
    return health.FaultEvidence(
        id=f.id,
        node=f.node,
        device=f.device,
        port=f.port,
        kind=health.FaultKind(f.kind),
        opened_at=f.opened_at,
        recovered_at=f.cleared_at,
        last_error_at=f.last_error_at,
        port_active=state == ACTIVE,
        port_since=since,
        switch=f.switch,
        note=str(f.detail.get("reason", "")),
    )


def window(row: m.MaintenanceWindow) -> health.Maintenance:
    """A stored maintenance window as the engine reads it."""
    return health.Maintenance(
        id=row.id,
        starts_at=row.start_at,
        ends_at=row.end_at,
        node=row.node,
        device=row.device,
        port=row.port,
        switch=row.switch,
        moves_at=row.moves_at,
        cancelled_at=row.cancelled_at,
        reason=row.reason,
    )


# Above this many nodes, evidence is read for the whole fleet and filtered here: the
# open faults and windows are few, and a query naming 8,192 nodes costs more than them.
MANY_NODES = 64


def evidence(
    session: Session, nodes: Iterable[str] | None, *, from_store: bool = False
) -> tuple[health.Evidence, list[OpenFault]]:
    """Every piece of evidence on `nodes` (all nodes when None), and the open faults behind
    it as they were read: from the engine's view in memory where it keeps one, else (and
    `from_store`) from the store."""
    wanted = None if nodes is None else set(nodes)
    view = None if from_store else evidence_view.view_of(session)
    if view is not None:
        rows = view.read(session, wanted, repos=_StoreReads(session))
        FaultRepo(session).remember(rows.faults)
    else:
        rows = _read(session, wanted)
    # Read as values, each row in its evidence type's field order; each fault the view
    # holds built once while it holds it.
    faults = (
        tuple(view.built(f, _evidence_of) for f in rows.faults)
        if view is not None
        else tuple(_evidence_of(f) for f in rows.faults)
    )
    return (
        health.Evidence(
            faults=faults,
            switches=tuple(health.SwitchEvidence(*s) for s in rows.switches),
            quarantines=tuple(health.Quarantine(*q) for q in rows.flags),
            maintenance=tuple(health.Maintenance(*w) for w in rows.windows),
        ),
        rows.faults,
    )


class _StoreReads:
    """The evidence's reads from the store, for its view in memory (store/evidence_view.py):
    the open faults at their ports on some nodes (None: all), or one other part whole."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def faults(self, nodes: list[str] | None) -> list[OpenFault]:
        return FaultRepo(self.s).unresolved_at_their_ports(nodes)

    def part(self, part: str) -> list[Any]:
        if part == evidence_view.FLAGS:
            return MaintenanceRepo(self.s).open_flag_values()
        if part == evidence_view.SWITCHES:
            return FaultRepo(self.s).open_switch_fault_values()
        return MaintenanceRepo(self.s).in_force(None)


def _read(session: Session, wanted: set[str] | None) -> evidence_view.EvidenceRows:
    """The evidence on `wanted` nodes read from the store (no view in memory)."""
    many = wanted is not None and len(wanted) > MANY_NODES
    faults = _faults_at_their_ports(session, wanted, many)
    flags = evidence_view.flags_on(MaintenanceRepo(session).open_flag_values(), wanted)
    switches = FaultRepo(session).open_switch_fault_values()
    windows = MaintenanceRepo(session).in_force(None if many else wanted)
    if many:
        windows = evidence_view.windows_on(windows, wanted)
    return evidence_view.EvidenceRows(faults, flags, switches, windows)


def _faults_at_their_ports(
    session: Session, wanted: set[str] | None, many: bool
) -> list[OpenFault]:
    """The open faults on the `wanted` nodes (all when None), each with its port's level;
    for `many` nodes read fleet-wide and kept here (see MANY_NODES)."""
    read = FaultRepo(session).unresolved_at_their_ports(None if many else wanted)
    if many and wanted is not None:
        return [f for f in read if f.node in wanted]
    return read


def has_cleared(session: Session, now: datetime, settings: Settings) -> bool:
    """Whether some fault's clearing rule is met at `now` (a read before taking write locks)."""
    ev, _ = evidence(session, None)
    return bool(ev.faults) and bool(health.assess(ev, now, rules(settings)).cleared)


def close_cleared(
    session: Session, now: datetime, settings: Settings, nodes: Iterable[str] | None = None
) -> list[m.Fault]:
    """Close every fault whose clearing rule is met at `now`; returns their rows, read by
    their ids (the evidence is read as values: most reads close nothing)."""
    ev, _ = evidence(session, nodes)
    assessed = health.assess(ev, now, rules(settings))
    if not assessed.cleared:
        return []
    why = {h.fault.id: h.reason for h in assessed.cleared}
    repo = FaultRepo(session)
    closed = list(repo.by_ids(why))
    for row in closed:
        repo.close(row, now, why[row.id], None)
    return closed


def clear_switches(
    session: Session, closed: Iterable[m.Fault], now: datetime, window_s: float
) -> list[str]:
    """Close the switch failures whose evidence is gone: no fault on the switch that was
    observed since the correlated set began (`window_s` before the failure was inferred)
    is open.

    Each port fault clears by its own damped rule, so the switch clears only once the
    last port under it has been up for the damping period, never on the first port up.
    A port that had failed on its own before the switch did (a cable, an RNIC) keeps its
    own fault, and no longer the whole switch's: found by the fleet twin, where one
    node's day-long cable fault held a leaf failed for hours after its repair, so every
    flap on another rail of that leaf left GPUs with no path and restarted the job.
    """
    repo = FaultRepo(session)
    cleared = []
    for switch in sorted({f.switch for f in closed if f.switch is not None}):
        row = repo.switch_fault_on(switch)
        if row is None:
            continue
        since = row.opened_at - timedelta(seconds=window_s)
        if not repo.switch_has_open_faults(switch, since) and repo.clear_switch_fault(switch, now):
            cleared.append(switch)
    return cleared


def nodes_touched(session: Session, faults: Iterable[m.Fault], switches: Iterable[str]) -> set[str]:
    """The nodes whose jobs closed faults and cleared switches touch."""
    nodes = {f.node for f in faults}
    repo = NodeRepo(session)
    for switch in switches:
        nodes |= {n for n, _, _ in repo.ports_on_switch(switch)}
    return nodes


# Topologies, plans and fabric ports of a set of nodes, given the lost parts on them.
Placement = tuple[
    Mapping[str, NodeTopology], Mapping[str, NodePlan], Mapping[str, frozenset[tuple[str, int]]]
]


def placement(
    session: Session, nodes: set[str], settings: Settings, lost: dict[str, list[OpenFault]]
) -> Placement:
    """The nodes' topologies and plans (from the plan cache) and their GPU-fabric ports."""
    topologies, plans = PLANS.get(session, nodes, settings.backup_cap_per_switch, lost)
    return topologies, plans, fabric_ports(topologies)


def fabric_ports(
    topologies: Mapping[str, NodeTopology],
) -> dict[str, frozenset[tuple[str, int]]]:
    return {
        name: frozenset((r.name, r.port) for r in t.rnics if r.carries_gpu_traffic)
        for name, t in topologies.items()
    }


def view_for(
    session: Session,
    nodes: set[str],
    now: datetime,
    settings: Settings,
    placed: Callable[[dict[str, list[OpenFault]]], Placement] | None = None,
) -> tuple[FabricView, health.FabricHealth]:
    """The fabric as the jobs on `nodes` see it at `now`.

    `placed` gives the nodes' topologies, plans and ports for the lost parts on them
    (a job's cached placement); without it they come from the plan cache.
    """
    ev, rows = evidence(session, nodes)
    lost: dict[str, list[OpenFault]] = {}
    for f in rows:
        if f.kind in LOST_KINDS:
            lost.setdefault(f.node, []).append(f)
    if placed is None:
        topologies, plans, ports = placement(session, nodes, settings, lost)
    else:
        topologies, plans, ports = placed(lost)
    assessed = health.assess(ev, now, rules(settings))
    return (
        FabricView(
            topologies=topologies,
            plans=plans,
            failed=assessed.failed,
            unhealthy=assessed.unhealthy,
            fabric_ports=ports,
            scheduled=assessed.scheduled,
            degraded=assessed.degraded,
        ),
        assessed,
    )
