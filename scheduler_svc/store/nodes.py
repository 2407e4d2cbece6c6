"""Registered nodes: their GPUs and RNICs (the topology), the observed level of each port,
and the fabric switch each port is cabled to."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, Result, Select, Text, bindparam, cast, select, update
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m
from scheduler_svc.store import plain

# The columns a node's topology is built from, in the order of engine.paths.Gpu and Rnic
# (Rnic's last, members, is read apart: NodeRepo.topology_rows).
TOPOLOGY_GPU = (
    m.Gpu.index,
    m.Gpu.pci,
    m.Gpu.numa,
    m.Gpu.pcie_switch,
    m.Gpu.root_complex,
    m.Gpu.nvlink,
)
TOPOLOGY_RNIC = (
    m.Rnic.name,
    m.Rnic.port,
    m.Rnic.pci,
    m.Rnic.numa,
    m.Rnic.pcie_switch,
    m.Rnic.root_complex,
    m.Rnic.rate_gbps,
    m.Rnic.switch,
    m.Rnic.rail,
    m.Rnic.state,
    m.Rnic.kind,
    m.Rnic.physfn,
)


# The statements of a report, built once (see store/commands.py). Their parameters are
# named apart from the columns: an UPDATE keeps a column's own name for its new value.
_DEVICE = (m.Rnic.node == bindparam("of_node"), m.Rnic.name == bindparam("of_device"))
_PORT = m.Rnic.port == bindparam("of_port")
_NEWER = m.Rnic.observed_at.is_(None) | (m.Rnic.observed_at <= bindparam("seen_at"))
_OBSERVED: dict[str, BindParameter[Any]] = {
    "state": bindparam("seen_state"),
    "observed_at": bindparam("seen_at"),
}
# Each port whose level the report becomes, with the switch it is cabled to (a fault opened
# on it names that switch, for correlation).
_CABLED = (m.Rnic.port, m.Rnic.switch)
_OBSERVE_PORT = update(m.Rnic).where(*_DEVICE, _PORT, _NEWER).values(_OBSERVED).returning(*_CABLED)
_OBSERVE_DEVICE = update(m.Rnic).where(*_DEVICE, _NEWER).values(_OBSERVED).returning(*_CABLED)
_SWITCH_OF_PORT = select(m.Rnic.switch).where(*_DEVICE, _PORT).limit(1)
_SWITCH_OF_DEVICE = select(m.Rnic.switch).where(*_DEVICE).limit(1)
_FLEET_STAMP = select(m.FleetStamp.version).where(m.FleetStamp.id == 1)


class NodeRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def get(self, name: str) -> m.Node | None:
        return self.s.get(m.Node, name)

    def _plain(self, stmt: Select[Any]) -> Result[Any]:
        """Rows of a column select past the ORM's result layer (half the cost of a session's
        execute for the 65,536 rows of a large placement)."""
        return plain.execute(self.s, stmt)

    def get_many(self, names: Iterable[str]) -> dict[str, m.Node]:
        rows = self.s.scalars(select(m.Node).where(m.Node.name.in_(list(names)))).all()
        return {n.name: n for n in rows}

    def topology_rows(self, names: Iterable[str]) -> dict[str, tuple[list[Any], list[Any]]]:
        """Each registered node's GPU and RNIC rows as plain tuples (TOPOLOGY_GPU's columns;
        TOPOLOGY_RNIC's, then `members` as a tuple): a job's placement names 8,192 nodes,
        whose 131,072 rows the ORM took seconds to load as objects."""
        wanted = list(names)
        out: dict[str, tuple[list[Any], list[Any]]] = {
            n: ([], [])
            for n in self._plain(select(m.Node.name).where(m.Node.name.in_(wanted))).scalars()
        }
        gpus = self._plain(select(m.Gpu.node, *TOPOLOGY_GPU).where(m.Gpu.node.in_(wanted)))
        for node, *row in gpus.tuples():
            out[node][0].append(tuple(row))
        # `members` as its JSON text, decoded only when not empty: decoding every port's
        # empty list was a third of the read.
        rnics = self._plain(
            select(m.Rnic.node, *TOPOLOGY_RNIC, cast(m.Rnic.members, Text)).where(
                m.Rnic.node.in_(wanted)
            )
        )
        for node, *row, members in rnics.tuples():
            listed = () if members in (None, "[]") else tuple(json.loads(members) or ())
            out[node][1].append((*row, listed))
        return out

    def gpu_indexes(self, names: Iterable[str]) -> dict[str, set[int]]:
        """Each registered node's GPU indexes (a node with none maps to an empty set), as
        plain rows: a 65,536-rank job names 8,192 nodes."""
        wanted = list(names)
        out = self.gpus_of(wanted)
        for n in self._plain(select(m.Node.name).where(m.Node.name.in_(wanted))).scalars():
            out.setdefault(n, set())
        return out

    def gpus_of(self, names: Iterable[str]) -> dict[str, set[int]]:
        """The GPU indexes of those of the nodes that have GPUs (`gpu_indexes` without the
        registered nodes that have none)."""
        out: dict[str, set[int]] = {}
        rows = self._plain(select(m.Gpu.node, m.Gpu.index).where(m.Gpu.node.in_(list(names))))
        for node, index in rows.tuples():
            group = out.get(node)
            if group is None:
                out[node] = {index}
            else:
                group.add(index)
        return out

    def rnic_names(self, names: Iterable[str]) -> dict[str, set[str]]:
        """Each node's RNIC device names, in one query."""
        out: dict[str, set[str]] = {}
        rows = self.s.execute(
            select(m.Rnic.node, m.Rnic.name).where(m.Rnic.node.in_(list(names))).distinct()
        )
        for node, name in rows.tuples():
            out.setdefault(node, set()).add(name)
        return out

    def all(self) -> Sequence[m.Node]:
        return self.s.scalars(select(m.Node).order_by(m.Node.name)).all()

    def fleet_stamp(self) -> int:
        """The fleet's registration stamp: it changes when any node registers anew or
        changes topology (`bump_fleet`). One row by its key, whatever the fleet's size; a
        cached job index is checked node by node (`versions`) only when it changed."""
        return int(plain.execute(self.s, _FLEET_STAMP).scalar() or 0)

    def bump_fleet(self) -> None:
        """Give the stamp a new value, in the transaction of the registration that changes
        the fleet. A random one, not a count: a count rolled back would be taken again by
        the next registration, and plans cached under it by the rolled-back transaction
        would then pass for current. On PostgreSQL the row stays locked until that commit:
        registrations that change topology take turns."""
        version = secrets.randbits(62)
        renewed = self.s.execute(
            update(m.FleetStamp).where(m.FleetStamp.id == 1).values(version=version)
        )
        if not getattr(renewed, "rowcount", 0):  # a store created without the row
            self.s.add(m.FleetStamp(id=1, version=version))
            self.s.flush()

    def versions(self, names: Iterable[str]) -> dict[str, tuple[int, datetime]]:
        """(topology version, registration time) per node: a cheap read that tells whether
        cached plans still hold. The time tells a node re-created in a fresh store (whose
        versions start again at 1) from the one a cache saw before."""
        rows = self._plain(
            select(m.Node.name, m.Node.topology_version, m.Node.registered_at).where(
                m.Node.name.in_(list(names))
            )
        )
        return {name: (version, at) for name, version, at in rows.tuples()}

    def replace_topology(
        self,
        name: str,
        gpus: list[dict[str, Any]],
        rnics: list[dict[str, Any]],
        now: datetime,
    ) -> tuple[m.Node, bool]:
        """Create or replace a node's topology; returns (node, changed)."""
        node = self.get(name)
        if node is None:
            node = m.Node(name=name, registered_at=now, updated_at=now, topology_version=1)
            node.gpus = [m.Gpu(node=name, **g) for g in gpus]
            node.rnics = [m.Rnic(node=name, **r) for r in rnics]
            self.s.add(node)
            self.s.flush()
            return node, True
        changed = _shape(node.gpus, GPU_FIELDS) != _shape(gpus, GPU_FIELDS) or _shape(
            node.rnics, RNIC_FIELDS
        ) != _shape(rnics, RNIC_FIELDS)
        node.updated_at = now
        if changed:
            node.gpus.clear()
            node.rnics.clear()
            self.s.flush()  # delete the old rows before their unique keys come back
            node.gpus.extend(m.Gpu(node=name, **g) for g in gpus)
            node.rnics.extend(m.Rnic(node=name, **r) for r in rnics)
            node.topology_version += 1
        else:
            # Which counters can count is what the agent sees now, not a topology change.
            now_counters = {(r["name"], r["port"]): r.get("counters") or {} for r in rnics}
            for row in node.rnics:
                counters = now_counters.get((row.name, row.port), {})
                if row.counters != counters:
                    row.counters = counters
        self.s.flush()
        return node, changed

    def observe_port(
        self, node: str, device: str, port: int | None, state: str, at: datetime
    ) -> list[tuple[int, str | None]]:
        """Record a port's state observed at `at` (every port of the RNIC when `port` is
        None or 0), unless a newer observation is known: the port's level.

        Returns the ports whose level it became, in port order, each with the switch it is
        cabled to (none: newer observations stand). Of two reports observed at the same
        time, the later one stands (an agent sends a port's reports in order).
        """
        asked = {"of_node": node, "of_device": device, "seen_state": state, "seen_at": at}
        if port:
            result = plain.execute(self.s, _OBSERVE_PORT, asked | {"of_port": port})
        else:
            result = plain.execute(self.s, _OBSERVE_DEVICE, asked)
        return sorted(result.tuples())

    def switch_of(self, node: str, device: str, port: int) -> str | None:
        asked = {"of_node": node, "of_device": device}
        if port:
            return plain.execute(self.s, _SWITCH_OF_PORT, asked | {"of_port": port}).scalar()
        return plain.execute(self.s, _SWITCH_OF_DEVICE, asked).scalar()

    def ports_on_switch(self, switch: str) -> list[tuple[str, str, int]]:
        rows = self.s.execute(
            select(m.Rnic.node, m.Rnic.name, m.Rnic.port).where(m.Rnic.switch == switch)
        )
        return list(rows.tuples().all())

    def fabric_ports(self, node: str) -> list[tuple[str, int]]:
        rows = self.s.execute(
            select(m.Rnic.name, m.Rnic.port).where(m.Rnic.node == node, m.Rnic.switch.is_not(None))
        )
        return list(rows.tuples().all())

    def switch_known(self, switch: str) -> bool:
        return (
            self.s.scalar(select(m.Rnic.node).where(m.Rnic.switch == switch).limit(1)) is not None
        )

    def nodes_on_switch(self, switch: str) -> list[str]:
        return sorted(
            self.s.scalars(select(m.Rnic.node).where(m.Rnic.switch == switch).distinct()).all()
        )


# The port states a report can set (sysfs also says INIT, ARMED, ...: not ACTIVE either).
DOWN = "DOWN"
ACTIVE = "ACTIVE"

GPU_FIELDS = ("index", "pci", "numa", "pcie_switch", "root_complex", "nvlink")
RNIC_FIELDS = (
    "name",
    "port",
    "pci",
    "numa",
    "pcie_switch",
    "root_complex",
    "rate_gbps",
    "link_layer",
    "netdev",
    "switch",
    "rail",
    "state",
    "kind",
    "physfn",
    "members",
)


_DEFAULTS: dict[str, Any] = {"kind": "physical", "members": []}


def _shape(rows: Iterable[Any], fields: Sequence[str]) -> list[tuple[Any, ...]]:
    """Rows (models or dicts) as comparable tuples, to tell a real topology change."""

    def get(row: Any, f: str) -> Any:
        # A dict that leaves a column out means its default, as the insert would store it.
        return row.get(f, _DEFAULTS.get(f)) if isinstance(row, dict) else getattr(row, f)

    return sorted(tuple(str(get(r, f)) for f in fields) for r in rows)
