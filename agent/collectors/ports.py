"""Ports: RNIC port state; leaving ACTIVE is ``port_down``, returning is ``port_up``."""

from __future__ import annotations

import os

from agent import metrics
from agent.collectors import names
from agent.collectors.base import Collected, Collector, CollectorContext, register
from agent.sysfs import parse_state, read_attr
from agent.topology import Topology

STATE_KEY = "ports"


@register
class PortsCollector(Collector):
    name = names.PORTS

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        # Last state seen, kept across restarts so a port that went down while
        # the agent was away is still reported, and one already reported is not.
        saved = ctx.load_state(STATE_KEY)
        self.last: dict[str, str] = dict(saved) if isinstance(saved, dict) else {}
        self.base = os.path.join(ctx.settings.sysfs_root, "class", "infiniband")

    def collect(self, topology: Topology | None) -> Collected:
        out = Collected()
        changed = False
        for dev, port in self.rnic_ports(topology):
            pdir = os.path.join(self.base, dev, "ports", str(port))
            state = parse_state(read_attr(os.path.join(pdir, "state")))
            if state is None:
                continue  # device gone; topology will notice
            key = f"{dev}/{port}"
            cur = state[1]
            metrics.PORT_ACTIVE.labels(dev, str(port)).set(1 if cur == "ACTIVE" else 0)
            prev = self.last.get(key)
            if prev == cur:
                continue
            self.last[key] = cur
            changed = True
            if prev is None:
                # First sight: the registration carries the state.
                continue
            kind = None
            if prev == "ACTIVE":
                kind = "port_down"
            elif cur == "ACTIVE":
                kind = "port_up"
            if kind is not None:
                phys = parse_state(read_attr(os.path.join(pdir, "phys_state")))
                out.events.append(
                    self.ctx.event(
                        kind,
                        device=dev,
                        port=port,
                        detail={
                            "state": cur,
                            "previous_state": prev,
                            "phys_state": phys[1] if phys else None,
                        },
                    )
                )
        if changed:
            out.state[STATE_KEY] = dict(self.last)
        return out
