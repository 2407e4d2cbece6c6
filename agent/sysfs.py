"""Reading sysfs attributes and parsing them the way Linux writes them."""

from __future__ import annotations

import os
import re
from pathlib import Path

# domain:bus:device.function as the kernel prints it (%04x:%02x:%02x.%d): a device number
# has five bits (00-1f), the domain more than four digits behind VMD or Hyper-V. \Z, not
# $: a name with a trailing newline is not one.
PCI_ADDR_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]\Z")
_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
_SPEED_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")


def read_attr(path: str | Path) -> str | None:
    """One attribute's text without the trailing newline, or None if unreadable.

    os.open/os.read rather than open(): the agent reads hundreds of these a
    second and the text-file machinery would be most of its CPU time.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except (OSError, ValueError):  # ValueError: a name with a NUL in it
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        # Some hw_counters return EINVAL/EOPNOTSUPP on read when firmware lacks them.
        return None
    finally:
        os.close(fd)
    return data.decode("ascii", "replace").strip()


def parse_state(text: str | None) -> tuple[int, str] | None:
    """``"4: ACTIVE"`` -> ``(4, "ACTIVE")``; also used for phys_state."""
    if not text or ":" not in text:
        return None
    num, _, name = text.partition(":")
    try:
        return int(num), name.strip()
    except ValueError:
        return None


def parse_rate(text: str | None) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> 400.0; ``"2.5 Gb/sec (1X SDR)"`` -> 2.5."""
    if not text:
        return None
    m = _RATE_RE.match(text)
    return float(m.group(1)) if m else None


def parse_link_speed(text: str | None) -> float | None:
    """``"16.0 GT/s PCIe"`` (or older ``"16 GT/s"``) -> 16.0; ``"Unknown"`` -> None."""
    if not text:
        return None
    m = _SPEED_RE.match(text)
    return float(m.group(1)) if m else None


def parse_int(text: str | None) -> int | None:
    """A decimal or 0x-hex attribute; None for ``"N/A (no PMA)"`` and the like."""
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def normalise_pci(bus_id: str | bytes) -> str:
    """NVML's ``00000000:07:00.0`` (any case) -> sysfs's ``0000:07:00.0``."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii")
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest}"
