"""Topology: GPUs, RNIC ports and their PCIe places, re-read every few minutes.

Each run returns a new immutable ``Topology`` snapshot; the supervisor hands it
to the other collectors' later runs and the agent registers it when its
fingerprint changes.
"""

from __future__ import annotations

import logging

from agent.collectors import names
from agent.collectors.base import Collected, Collector, CollectorContext, register
from agent.railmap import load_rail_map
from agent.topology import Topology, discover

log = logging.getLogger(__name__)


@register
class TopologyCollector(Collector):
    name = names.TOPOLOGY
    provides_topology = True

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.rail_map = ctx.rail_map
        self._rail_map_mtime = self._mtime()

    def interval_s(self) -> float:
        return self.ctx.settings.topology_interval_s

    def _mtime(self) -> float | None:
        path = self.ctx.settings.rail_map
        try:
            return path.stat().st_mtime if path is not None else None
        except OSError:
            return None

    def collect(self, topology: Topology | None) -> Collected:
        # The rail map is usually a mounted ConfigMap that Kubernetes updates
        # in place; re-read it when it changes. A broken edit raises here, so
        # the collector reports failure and the last good map stays in use.
        mtime = self._mtime()
        if mtime != self._rail_map_mtime:
            self.rail_map = load_rail_map(self.ctx.settings.rail_map)
            self._rail_map_mtime = mtime
            log.info("rail map %s reloaded", self.ctx.settings.rail_map)
        return Collected(topology=discover(self.ctx.settings.sysfs_root, self.rail_map))
