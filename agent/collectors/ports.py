"""Ports: RNIC port state; leaving ACTIVE is ``port_down``, returning is ``port_up``; a
rate (speed x width) that changed is ``port_rate``, the service's evidence of a port
that renegotiated below the rate it registered with (or back to it)."""

from __future__ import annotations

import os

from agent import metrics
from agent.collectors import names
from agent.collectors.base import Collected, Collector, CollectorContext, register
from agent.sysfs import parse_rate, parse_state, read_attr
from agent.topology import MAX_RATE_GBPS, Topology

STATE_KEY = "ports"
RATES_KEY = "port_rates"


@register
class PortsCollector(Collector):
    name = names.PORTS

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        # Last state seen, kept across restarts so a port that went down while
        # the agent was away is still reported, and one already reported is not.
        saved = ctx.load_state(STATE_KEY)
        self.last: dict[str, str] = dict(saved) if isinstance(saved, dict) else {}
        rates = ctx.load_state(RATES_KEY)
        self.rates: dict[str, float] = dict(rates) if isinstance(rates, dict) else {}
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
            # A port not ACTIVE says nothing of the rate it carries traffic at.
            if cur == "ACTIVE" and self._rate(pdir, key, dev, port, out):
                out.state[RATES_KEY] = dict(self.rates)
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

    def _rate(self, pdir: str, key: str, dev: str, port: int, out: Collected) -> bool:
        """A ``port_rate`` event when the port's rate changed; whether it did."""
        rate = parse_rate(read_attr(os.path.join(pdir, "rate")))
        if rate is None or not 0 <= rate <= MAX_RATE_GBPS:
            return False  # unreadable, or a port down that says nothing of its speed
        prev = self.rates.get(key)
        if prev == rate:
            return False
        self.rates[key] = rate
        if prev is not None:  # the first sight: the registration carries it
            out.events.append(
                self.ctx.event(
                    "port_rate",
                    device=dev,
                    port=port,
                    rate_gbps=int(rate) if float(rate).is_integer() else rate,
                    detail={"previous_gbps": prev},
                )
            )
        return True
