"""Where a port's counter lives, whether it can count, and how it behaves at its limit.

A port exposes counters in up to three groups (drivers/infiniband/core/sysfs.c and
the drivers' hw stats):

- ``counters/``: the PMA PortCounters. Error counters are 4 to 16 bits wide and
  *saturate* at their field width (IBA 1.4, PortCounters) instead of wrapping. The
  data and packet counters are 32-bit and saturate too, unless the PMA has the
  extended (64-bit) counters, which the kernel then shows under the same names. A
  port with no PMA behind it (RoCE on mlx5) reads ``N/A (no PMA)``.
- ``counters_ext/``: the 64-bit PortCountersExtended of older HCAs
  (``port_xmit_data_64``, ``port_unicast_rcv_packets``, ...).
- ``hw_counters/``: the driver's own statistics (mlx5: ``local_ack_timeout_err``,
  ``req_cqe_error``, ...), exposed as 64-bit values.

A watched counter is looked up by its name in each group (and as ``<name>_64`` in
``counters_ext/``), the wide forms first; the first one that reads as a number is
the one used. A 64-bit counter never reaches its limit in practice, so whatever
the width a value below the last one is a reset (perfquery -R, a driver reload),
never a wrap.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agent.sysfs import parse_int, read_attr

GROUPS = ("counters", "counters_ext", "hw_counters")
AVAILABLE = "available"
# What a reason may hold: printable ASCII, short (the service stores up to 128 characters).
_REASON_MAX = 100

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
# PortCounters' data and packet counters: 32-bit, shown 64-bit when the PMA has the
# extended ones (a value above 2**32 - 1 says so).
PMA_DATA_BITS = 32


@dataclass(frozen=True)
class CounterFile:
    """One counter's file and how it behaves at its limit."""

    name: str
    group: str
    path: str
    width_bits: int
    saturating: bool

    def saturation_value(self, value: int) -> int | None:
        """The value at which it sticks, or None where it cannot (64-bit, or already past 32)."""
        if not self.saturating:
            return None
        limit = (1 << self.width_bits) - 1
        return None if value > limit else limit


def candidates(port_dir: str, name: str) -> list[CounterFile]:
    """The files ``name`` may be read from on one port, the widest first."""
    ext = os.path.join(port_dir, "counters_ext")
    pma_bits = PMA_WIDTH_BITS.get(name, PMA_DATA_BITS)
    return [
        CounterFile(name, "counters_ext", os.path.join(ext, f"{name}_64"), 64, False),
        CounterFile(name, "counters_ext", os.path.join(ext, name), 64, False),
        CounterFile(name, "counters", os.path.join(port_dir, "counters", name), pma_bits, True),
        CounterFile(name, "hw_counters", os.path.join(port_dir, "hw_counters", name), 64, False),
    ]


def _reason_text(text: str) -> str:
    clean = "".join(c if " " <= c <= "~" else "?" for c in text).strip()
    return (clean or "empty")[:_REASON_MAX]


def resolve(port_dir: str, name: str) -> tuple[CounterFile | None, str]:
    """The file a watched counter is read from and ``"available"``; or None and
    ``"unavailable (<why>)"``: what the file says (``N/A (no PMA)``), that it cannot be
    read, or that no group has it."""
    why: str | None = None
    for cf in candidates(port_dir, name):
        text = read_attr(cf.path)
        if text is None:
            if why is None and os.path.lexists(cf.path):
                why = f"{cf.group}/{os.path.basename(cf.path)} cannot be read"
            continue
        value = parse_int(text)
        if value is not None and value >= 0:
            return cf, AVAILABLE
        if why is None:
            why = _reason_text(text)
    return None, f"unavailable ({why or 'not exposed by the driver'})"


def availability(port_dir: str, watched: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``(name, "available" | "unavailable (<why>)")`` for each watched counter, in order."""
    return tuple((name, resolve(port_dir, name)[1]) for name in watched)
