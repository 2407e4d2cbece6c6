"""Counters: RNIC error counters; a rise of a watched one is a ``counter`` event.

Counters are read as data: whatever name the driver exposes under ``counters/``,
``counters_ext/`` or ``hw_counters/`` (mlx5 puts the transport errors in the
last), found by the rules in ``agent.counter_files``; one that reads ``N/A (no
PMA)`` cannot count, and says so once at registration (the topology reports each
watched counter's availability). Only the watched names
(RAILOVER_AGENT_COUNTER_EVENTS) are read each poll, which keeps the agent's cost
per port to a handful of reads.

PMA counters saturate at their field width instead of wrapping, and the 64-bit
ones never reach theirs, so a smaller value than last time means the counter
was reset, not that it wrapped: the delta is then the new value itself.
"""

from __future__ import annotations

import os

from agent.collectors import names
from agent.collectors.base import Collected, Collector, CollectorContext, register
from agent.counter_files import GROUPS, PMA_WIDTH_BITS, CounterFile, resolve
from agent.sysfs import parse_int, read_attr
from agent.topology import Topology

STATE_KEY = "counters"
__all__ = ["GROUPS", "PMA_WIDTH_BITS", "CountersCollector", "counter_delta", "saturation_value"]


def saturation_value(name: str) -> int | None:
    """Where a PortCounters error counter sticks (None for the ones of no known width)."""
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
        # (dev, port) -> the files of the watched names that can count there.
        self._paths: dict[tuple[str, int], list[CounterFile]] = {}

    def _resolve(self, dev: str, port: int) -> list[CounterFile]:
        found = self._paths.get((dev, port))
        if found is not None:
            return found
        pdir = os.path.join(self.base, dev, "ports", str(port))
        found = [cf for cf in (resolve(pdir, n)[0] for n in self.watched) if cf is not None]
        self._paths[(dev, port)] = found
        return found

    def collect(self, topology: Topology | None) -> Collected:
        out = Collected()
        changed = False
        ports = self.rnic_ports(topology)
        for stale in set(self._paths) - set(ports):
            del self._paths[stale]
        for dev, port in ports:
            for cf in self._resolve(dev, port):
                name = cf.name
                cur = parse_int(read_attr(cf.path))
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
                delta, reset, saturated = counter_delta(prev, cur, cf.saturation_value(cur))
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
                            "group": cf.group,
                            "width_bits": cf.width_bits,
                            "reset": reset,
                            "saturated": saturated,
                        },
                    )
                )
        if changed:
            out.state[STATE_KEY] = dict(self.last)
        return out
