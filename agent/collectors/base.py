"""What every collector is: a small class registered by name.

A polled collector's ``collect()`` reads its source and returns events plus
the state it wants persisted with them (in the same spool transaction, so a
crash can neither lose the event nor report it twice). It runs in a worker
thread; it never touches the spool or the network. A failing collector is
isolated by the poll loop and shows up as
``railover_agent_collector_success{collector} 0``.
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


@dataclass
class CollectorContext:
    """What collectors share: settings, the latest topology, persisted state."""

    settings: AgentSettings
    rail_map: RailMap
    load_state: Callable[[str], Any]
    topology: Topology | None = None

    @property
    def node(self) -> str:
        return self.settings.node_name

    def event(self, kind: str, **fields: Any) -> Event:
        return new_event(self.node, kind, **fields)

    def rnic_ports(self) -> list[tuple[str, int]]:
        if self.topology is not None:
            return self.topology.rnic_ports()
        return list_rnic_ports(self.settings.sysfs_root)


class Collector(abc.ABC):
    """A source of events; ``name`` is what DISABLED_COLLECTORS refers to."""

    name: ClassVar[str]
    polled: ClassVar[bool] = True

    def __init__(self, ctx: CollectorContext) -> None:
        self.ctx = ctx

    def interval_s(self) -> float:
        return self.ctx.settings.poll_interval_s

    @abc.abstractmethod
    def collect(self) -> Collected: ...


REGISTRY: dict[str, type[Collector]] = {}
C = TypeVar("C", bound=type[Collector])


def register(cls: C) -> C:
    if cls.name in REGISTRY:
        raise ValueError(f"collector {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls
