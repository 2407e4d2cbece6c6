"""What every collector is: a small class registered by name.

A polled collector's ``collect(topology)`` reads its source and returns events
plus the state it wants persisted with them (in the same spool transaction, so
a crash can neither lose the event nor report it twice). ``topology`` is the
node's topology as last discovered: an immutable snapshot handed to the run,
never shared state, so what a collector sees does not depend on which
collectors were imported or ran before it. The topology collector is the one
that produces new snapshots (``Collected.topology``).

Each collector runs in its own thread under its own timeout
(``agent.collectors.supervise``); it never touches the spool or the network. A
collector that fails or overruns its timeout shows up as
``railover_agent_collector_success{collector} 0`` while the others go on.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from agent.events import Event, new_event
from agent.topology import list_rnic_ports

if TYPE_CHECKING:
    from agent.config import AgentSettings
    from agent.railmap import RailMap
    from agent.topology import Topology


@dataclass
class Collected:
    events: list[Event] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    # A new topology snapshot; set by the topology collector only.
    topology: Topology | None = None


@dataclass(frozen=True)
class CollectorContext:
    """What collectors are made with, fixed for the agent's life.

    ``rail_map`` is the map read at start; the topology collector keeps its own
    current copy when the file changes.
    """

    settings: AgentSettings
    rail_map: RailMap
    load_state: Callable[[str], Any]

    @property
    def node(self) -> str:
        return self.settings.node_name

    def event(self, kind: str, **fields: Any) -> Event:
        return new_event(self.node, kind, **fields)


class Collector(abc.ABC):
    """A source of events; ``name`` is what DISABLED_COLLECTORS refers to."""

    name: ClassVar[str]
    polled: ClassVar[bool] = True
    # True for the collector whose results carry new topology snapshots: it runs
    # first at start, so the others begin with a snapshot.
    provides_topology: ClassVar[bool] = False

    def __init__(self, ctx: CollectorContext) -> None:
        self.ctx = ctx

    def interval_s(self) -> float:
        return self.ctx.settings.poll_interval_s

    def timeout_s(self) -> float:
        """How long one run may take before it counts as failed (it may finish later)."""
        return self.ctx.settings.collector_timeout_s

    def rnic_ports(self, topology: Topology | None) -> list[tuple[str, int]]:
        """The snapshot's RNIC ports; before the first discovery, whatever sysfs lists."""
        if topology is not None:
            return topology.rnic_ports()
        return list_rnic_ports(self.ctx.settings.sysfs_root)

    @abc.abstractmethod
    def collect(self, topology: Topology | None) -> Collected: ...


REGISTRY: dict[str, type[Collector]] = {}
C = TypeVar("C", bound=type[Collector])


def register(cls: C) -> C:
    if cls.name in REGISTRY:
        raise ValueError(f"collector {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls
