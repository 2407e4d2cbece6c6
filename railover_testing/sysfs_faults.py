"""Faults injected into a fixture node's sysfs tree while an agent reads it.

Each helper changes files in place, atomically, so a running agent sees a port
go down, a counter rise or a PCIe link train down, never a half-written value.
"""

from __future__ import annotations

import os
from pathlib import Path

from railover_testing.sysfs_kernel_values import PHYS_STATES, PORT_STATES


def _atomic_put(path: Path, value: str | int) -> None:
    # A reader polling concurrently must never see a half-written value, as on
    # real sysfs where a read returns the whole attribute or nothing.
    if not path.exists():
        raise FileNotFoundError(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{value}\n")
    os.replace(tmp, path)


def _port_dir(root: Path, device: str, port: int) -> Path:
    return Path(root) / "class" / "infiniband" / device / "ports" / str(port)


def set_port_state(
    root: Path, device: str, port: int, state: str, phys_state: str | None = None
) -> None:
    """Set a port's state, e.g. "DOWN"; phys_state follows unless given."""
    d = _port_dir(root, device, port)
    if phys_state is None:
        phys_state = "LinkUp" if state in ("ACTIVE", "ARMED", "INIT") else "Disabled"
    _atomic_put(d / "state", f"{PORT_STATES[state]}: {state}")
    _atomic_put(d / "phys_state", f"{PHYS_STATES[phys_state]}: {phys_state}")


def set_port_rate(root: Path, device: str, port: int, gbps: float, width: str = "4X") -> None:
    """Set a port's rate as ib_core prints it, e.g. 200 -> "200 Gb/sec (4X)"."""
    _atomic_put(_port_dir(root, device, port) / "rate", f"{gbps:g} Gb/sec ({width})")


def read_counter(root: Path, device: str, port: int, name: str, hw: bool = False) -> str:
    d = _port_dir(root, device, port) / ("hw_counters" if hw else "counters")
    return (d / name).read_text().strip()


def bump_counter(
    root: Path, device: str, port: int, name: str, delta: int = 1, *, hw: bool | None = None
) -> int:
    """Raise a counter by ``delta``; finds it under counters/ or hw_counters/."""
    d = _port_dir(root, device, port)
    path = d / "counters" / name
    if hw or (hw is None and not path.exists()):
        path = d / "hw_counters" / name
    value = int(path.read_text().strip()) + delta
    _atomic_put(path, value)
    return value


def set_counter(root: Path, device: str, port: int, name: str, value: int | str) -> None:
    d = _port_dir(root, device, port)
    path = d / "counters" / name
    if not path.exists():
        path = d / "hw_counters" / name
    _atomic_put(path, value)


def _pci_dir(root: Path, pci: str) -> Path:
    return (Path(root) / "bus" / "pci" / "devices" / pci).resolve()


def degrade_pcie_link(
    root: Path, pci: str, width: int | None = None, speed: str | None = None
) -> None:
    """Make a PCI function's link train down (lower width and/or speed)."""
    d = _pci_dir(root, pci)
    if width is not None:
        _atomic_put(d / "current_link_width", width)
    if speed is not None:
        _atomic_put(d / "current_link_speed", speed)


def restore_pcie_link(root: Path, pci: str) -> None:
    d = _pci_dir(root, pci)
    _atomic_put(d / "current_link_width", (d / "max_link_width").read_text().strip())
    _atomic_put(d / "current_link_speed", (d / "max_link_speed").read_text().strip())
