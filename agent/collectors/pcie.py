"""PCIe: a GPU's or RNIC's link that trained down (width or speed below max), and the
same link back at its maximum (a ``pcie_degraded`` report whose figures are the maximum:
the service keeps the newest report of a link as its level)."""

from __future__ import annotations

import os
from typing import Any

from agent.collectors import names
from agent.collectors.base import Collected, Collector, CollectorContext, register
from agent.sysfs import parse_int, parse_link_speed, read_attr
from agent.topology import Topology

STATE_KEY = "pcie"


@register
class PcieCollector(Collector):
    name = names.PCIE

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        saved = ctx.load_state(STATE_KEY)
        # pci -> "width/speed" while degraded; absent when at full width/speed.
        self.degraded: dict[str, str] = dict(saved) if isinstance(saved, dict) else {}
        self.bus = os.path.join(ctx.settings.sysfs_root, "bus", "pci", "devices")

    @staticmethod
    def _devices(topo: Topology | None) -> list[tuple[str, dict[str, Any]]]:
        if topo is None:
            return []  # PCIe places come from discovery; nothing to watch before it
        out: list[tuple[str, dict[str, Any]]] = []
        seen: set[str] = set()
        for r in topo.rnics:
            # A device with no PCI function (soft) has no link to train down.
            if r.pci is not None and r.pci not in seen:
                seen.add(r.pci)
                out.append((r.pci, {"device": r.name}))
        for g in topo.gpus:
            out.append((g.pci, {"detail_gpu": g.index}))
        return out

    def collect(self, topology: Topology | None) -> Collected:
        out = Collected()
        changed = False
        for pci, who in self._devices(topology):
            d = os.path.join(self.bus, pci)
            cw = parse_int(read_attr(os.path.join(d, "current_link_width")))
            mw = parse_int(read_attr(os.path.join(d, "max_link_width")))
            cs = parse_link_speed(read_attr(os.path.join(d, "current_link_speed")))
            ms = parse_link_speed(read_attr(os.path.join(d, "max_link_speed")))
            if cw is None or mw is None or cs is None or ms is None:
                continue  # no PCIe capability (or link down: speed "Unknown")
            sig = f"x{cw}@{cs:g}GT/s"
            is_degraded = cw < mw or cs < ms
            prev = self.degraded.get(pci)
            if not is_degraded and prev is None:
                continue
            if is_degraded and prev == sig:
                continue
            if is_degraded:
                self.degraded[pci] = sig
            else:
                del self.degraded[pci]
            changed = True
            detail: dict[str, Any] = {
                "pci": pci,
                "current_width": cw,
                "max_width": mw,
                "current_speed_gts": cs,
                "max_speed_gts": ms,
                "restored": not is_degraded,
            }
            if "detail_gpu" in who:
                detail["gpu"] = who["detail_gpu"]
            out.events.append(
                self.ctx.event("pcie_degraded", device=who.get("device"), detail=detail)
            )
        if changed:
            out.state[STATE_KEY] = dict(self.degraded)
        return out
