"""Counters: RNIC error counters; a rise of a watched one is a ``counter`` event.

Counters are read as data: whatever name the driver exposes under
``counters/`` or ``hw_counters/`` (mlx5 puts the transport errors in the
latter), ``N/A (no PMA)`` skipped. Only the watched names
(RAILOVER_AGENT_COUNTER_EVENTS) are read each poll, which keeps the agent's
cost per port to a handful of reads.

InfiniBand PMA counters saturate at their field width instead of wrapping
(IBA 1.4, PortCounters), so a smaller value than last time means the counter
was reset, not that it wrapped: the delta is then the new value itself.
"""

from __future__ import annotations

import os

from agent.collectors import names
from agent.collectors.base import Collected, Collector, CollectorContext, register
from agent.sysfs import parse_int, read_attr
from agent.topology import Topology

STATE_KEY = "counters"
GROUPS = ("counters", "hw_counters")

# Field widths of the PortCounters attribute; a counter at 2**w - 1 is stuck.
PMA_WIDTH_BITS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_wait": 32,
}


def saturation_value(name: str) -> int | None:
    bits = PMA_WIDTH_BITS.get(name)
    return None if bits is None else (1 << bits) - 1


def counter_delta(prev: int, cur: int, saturates_at: int | None) -> tuple[int, bool, bool]:
    """(delta, was_reset, is_saturated) between two readings of one counter."""
    saturated = saturates_at is not None and cur >= saturates_at
    if cur >= prev:
        return cur - prev, False, saturated
    # Went down: reset (perfquery -R, driver reload), never a wrap.
    return cur, True, saturated


@register
class CountersCollector(Collector):
    name = names.COUNTERS

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        saved = ctx.load_state(STATE_KEY)
        self.last: dict[str, int] = dict(saved) if isinstance(saved, dict) else {}
        self.watched = tuple(ctx.settings.counter_events)
        self.base = os.path.join(ctx.settings.sysfs_root, "class", "infiniband")
        # (dev, port) -> [(name, group, path)] for the watched names that exist.
        self._paths: dict[tuple[str, int], list[tuple[str, str, str]]] = {}
        self._saturated_logged: set[str] = set()

    def _resolve(self, dev: str, port: int) -> list[tuple[str, str, str]]:
        found = self._paths.get((dev, port))
        if found is not None:
            return found
        pdir = os.path.join(self.base, dev, "ports", str(port))
        found = []
        for group in GROUPS:
            try:
                names = set(os.listdir(os.path.join(pdir, group)))
            except OSError:
                continue
            found.extend(
                (n, group, os.path.join(pdir, group, n)) for n in self.watched if n in names
            )
        self._paths[(dev, port)] = found
        return found

    def collect(self, topology: Topology | None) -> Collected:
        out = Collected()
        changed = False
        ports = self.rnic_ports(topology)
        for stale in set(self._paths) - set(ports):
            del self._paths[stale]
        for dev, port in ports:
            for name, group, path in self._resolve(dev, port):
                cur = parse_int(read_attr(path))
                if cur is None:
                    continue  # "N/A (no PMA)", or unreadable on this firmware
                key = f"{dev}/{port}/{name}"
                prev = self.last.get(key)
                if prev == cur:
                    continue
                self.last[key] = cur
                changed = True
                if prev is None:
                    continue  # first reading is the baseline
                delta, reset, saturated = counter_delta(prev, cur, saturation_value(name))
                if delta <= 0:
                    continue
                out.events.append(
                    self.ctx.event(
                        "counter",
                        device=dev,
                        port=port,
                        counter=name,
                        delta=delta,
                        detail={
                            "value": cur,
                            "group": group,
                            "reset": reset,
                            "saturated": saturated,
                        },
                    )
                )
        if changed:
            out.state[STATE_KEY] = dict(self.last)
        return out
