"""Topology: GPUs, RNIC ports and their PCIe places, re-read every few minutes."""

from __future__ import annotations

from agent.collectors.base import Collected, Collector, register
from agent.topology import discover


@register
class TopologyCollector(Collector):
    name = "topology"

    def interval_s(self) -> float:
        return self.ctx.settings.topology_interval_s

    def collect(self) -> Collected:
        # The agent compares fingerprints and re-registers when this changes.
        self.ctx.topology = discover(self.ctx.settings.sysfs_root, self.ctx.rail_map)
        return Collected()
