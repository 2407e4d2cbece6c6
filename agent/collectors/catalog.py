"""Every polled collector, imported so that each registers itself in ``REGISTRY``.

What the runner builds its collectors from. The settings never import this
module: they check names against ``agent.collectors.names``, the leaf list.
"""

from __future__ import annotations

from agent.collectors import counters, pcie, ports, topology
from agent.collectors.base import REGISTRY

__all__ = ["REGISTRY", "counters", "pcie", "ports", "topology"]
