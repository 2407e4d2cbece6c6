"""The agent's collectors, registered by name (see ``base``)."""

from __future__ import annotations

from agent.collectors import counters, pcie, ports, topology
from agent.collectors.base import REGISTRY, Collected, Collector, CollectorContext, register
from agent.collectors.supervise import Supervisor

__all__ = [
    "REGISTRY",
    "Collected",
    "Collector",
    "CollectorContext",
    "Supervisor",
    "counters",
    "pcie",
    "ports",
    "register",
    "registered_names",
    "topology",
]

# The plugin listener is not polled, but it is switched off the same way.
PLUGIN = "plugin"


def registered_names() -> list[str]:
    return [*REGISTRY, PLUGIN]
