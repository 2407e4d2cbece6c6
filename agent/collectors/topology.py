"""Topology: GPUs, RNIC ports and their PCIe places, re-read every few minutes.

Each run returns a new immutable ``Topology`` snapshot; the supervisor hands it
to the other collectors' later runs and the agent registers it when its
fingerprint changes.

A GPU or RNIC that the last snapshot had and this one has not is reported at
once as a ``device_lost`` event, not only as a smaller registration. What was
there is kept in the spool's state, so a device that vanished while the agent
was down is reported too. Each watched counter that cannot count on a port is
logged once and exported as ``railover_agent_port_statistic_available 0``.
"""

from __future__ import annotations

import logging
from typing import Any

from agent import metrics
from agent.collectors import names
from agent.collectors.base import Collected, Collector, CollectorContext, register
from agent.counter_files import AVAILABLE
from agent.events import Event
from agent.railmap import load_rail_map
from agent.topology import Topology, discover

log = logging.getLogger(__name__)

STATE_KEY = "topology_devices"


def _devices(topo: Topology) -> dict[str, Any]:
    """What a lost-device report compares: GPU PCI address -> index, RNIC -> PCI or None.
    GPUs by address: without NVML their indexes follow bus order, so the GPUs after a lost
    one move down an index, and the one to report is the address gone, by its old index."""
    return {
        "gpus": {g.pci: g.index for g in topo.gpus},
        "rnics": {r.name: r.pci for r in topo.rnics},
    }


@register
class TopologyCollector(Collector):
    name = names.TOPOLOGY
    provides_topology = True

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.rail_map = ctx.rail_map
        self._rail_map_mtime = self._mtime()
        saved = ctx.load_state(STATE_KEY)
        self.known: dict[str, Any] | None = saved if isinstance(saved, dict) else None
        self._unavailable_logged: set[tuple[str, int, str, str]] = set()

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
        topo = discover(
            self.ctx.settings.sysfs_root,
            self.rail_map,
            watched=tuple(self.ctx.settings.counter_events),
        )
        self._report_counters(topo)
        out = Collected(topology=topo)
        now = _devices(topo)
        if now != self.known:
            out.events = self._lost(self.known, now)
            self.known = now
            out.state[STATE_KEY] = now
        return out

    def _lost(self, before: dict[str, Any] | None, now: dict[str, Any]) -> list[Event]:
        """A ``device_lost`` event for each GPU and RNIC ``before`` had and ``now`` has not."""
        if before is None:
            return []
        events: list[Event] = []
        old_gpus, old_rnics = before.get("gpus") or {}, before.get("rnics") or {}
        for pci, index in sorted(old_gpus.items()):
            if pci not in now["gpus"] and isinstance(index, int):
                log.warning("GPU %s (%s) is gone from sysfs", index, pci)
                events.append(self.ctx.event("device_lost", gpu=index, detail={"pci": pci}))
        for dev, pci in sorted(old_rnics.items()):
            if dev not in now["rnics"]:
                log.warning("RDMA device %s (%s) is gone from sysfs", dev, pci)
                events.append(self.ctx.event("device_lost", device=dev, detail={"pci": pci}))
        return events

    def _report_counters(self, topo: Topology) -> None:
        """Each watched counter's availability as a metric; one that cannot count, logged
        once for each reason."""
        for r in topo.rnics:
            for counter, availability in r.counters:
                ok = availability == AVAILABLE
                metrics.COUNTER_AVAILABLE.labels(r.name, str(r.port), counter).set(int(ok))
                key = (r.name, r.port, counter, availability)
                if not ok and key not in self._unavailable_logged:
                    self._unavailable_logged.add(key)
                    log.warning(
                        "counter %s on %s can never report a rise: %s",
                        counter,
                        r.key,
                        availability,
                    )
