"""Discovery on random sysfs-shaped trees (issue 31): RDMA devices under PCI chains, SFs,
VFs, the virtual tree or nowhere, with missing, dangling, looping and escaping links,
unreadable files and odd contents. It never raises, never reports a malformed PCI
address, never blocks, and what it registers is always a body the service takes."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.topology import Topology, discover
from scheduler_svc.api.schemas.nodes import NodeIn

# The service's PciAddress pattern (scheduler_svc/api/schemas/fields.py).
SERVICE_PCI = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-1][0-9a-fA-F]\.[0-7]$")
WATCHED = ("link_downed", "symbol_error", "port_xmit_data", "req_cqe_error")

DEV_NAMES = st.sampled_from(
    ["mlx5_0", "mlx5_1", "mlx5_bond_0", "rxe0", "siw0", "hfi1_0", "bad name", "a" * 70, "x\n"]
)
HOST_BRIDGES = st.sampled_from(["pci0000:14", "pci10000:e0", "pcixyz", "platform"])
PCI_NAMES = st.sampled_from(
    ["0000:14:01.0", "0000:17:00.0", "0000:17:00.1", "10000:e1:00.0", "0000:00:ff.0", "zz:00.0"]
)
TEXTS = st.one_of(
    st.sampled_from(
        [
            "4: ACTIVE",
            "1: DOWN",
            "ACTIVE",
            "N/A (no PMA)",
            "400 Gb/sec (4X NDR)",
            "9999999 Gb/sec",
            "InfiniBand",
            "Ethernet",
            "-1",
            "7",
            "100000",
            "18446744073709551615",
            "0x10de",
            "0x030200",
            "0-3,8-11",
            "0-99999999999",
            "",
        ]
    ),
    st.text(max_size=40),
    st.binary(max_size=40),
)
PORT_FILES = st.sampled_from(["state", "phys_state", "rate", "link_layer"])
COUNTER_FILES = st.sampled_from(
    [
        "counters/link_downed",
        "counters/symbol_error",
        "counters/port_xmit_data",
        "counters_ext/port_xmit_data_64",
        "hw_counters/req_cqe_error",
        "gid_attrs/ndevs/0",
    ]
)
LINK_TARGETS = st.sampled_from(["parent", "nowhere", "self", "root", "outside", "file"])


def _write(path: Path, content: str | bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, errors="surrogateescape")


def _link(link: Path, how: str, parent: Path, root: Path) -> None:
    target = {
        "parent": parent,
        "nowhere": root / "devices" / "gone",
        "self": link,  # a loop
        "root": Path("/"),
        "outside": root.parent,
        "file": root / "devices" / "system" / "node" / "online",
    }[how]
    with contextlib.suppress(OSError):
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)


@st.composite
def rdma_device(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "name": draw(DEV_NAMES),
        "where": draw(st.sampled_from(["pci", "sf", "vf", "virtual", "class", "nowhere"])),
        "bridge": draw(HOST_BRIDGES),
        "chain": draw(st.lists(PCI_NAMES, max_size=4)),
        "device_link": draw(st.one_of(st.none(), LINK_TARGETS)),
        "ports": draw(st.lists(st.sampled_from(["1", "2", "0", "300", "x"]), max_size=3)),
        "files": draw(st.lists(st.tuples(PORT_FILES, TEXTS), max_size=4)),
        "counters": draw(st.lists(st.tuples(COUNTER_FILES, TEXTS), max_size=4)),
        "pci_files": draw(
            st.lists(
                st.tuples(
                    st.sampled_from(["numa_node", "local_cpulist", "vendor", "class"]), TEXTS
                ),
                max_size=3,
            )
        ),
        "unreadable": draw(st.booleans()),
    }


def _place(root: Path, d: dict[str, Any]) -> None:
    devices = root / "devices"
    parent = devices / d["bridge"]
    for p in d["chain"]:
        parent /= p
    where = d["where"]
    if where == "sf":
        parent /= "mlx5_core.sf.2"
        _link(parent / "subsystem", "nowhere", parent, root)
    if where == "vf":
        _link(parent / "physfn", d["device_link"] or "parent", parent.parent, root)
    if where == "virtual":
        dev_dir = devices / "virtual" / "infiniband" / d["name"]
    elif where in ("class", "nowhere"):
        dev_dir = root / "class" / "infiniband" / d["name"]
    else:
        dev_dir = parent / "infiniband" / d["name"]
    for name, text in d["pci_files"]:
        _write(parent / name, text)
        with contextlib.suppress(OSError):
            os.symlink(parent, root / "bus" / "pci" / "devices" / parent.name)
    for port in d["ports"] or ["1"]:
        pdir = dev_dir / "ports" / port
        with contextlib.suppress(OSError):
            pdir.mkdir(parents=True, exist_ok=True)
        for name, text in d["files"]:
            _write(pdir / name, text)
        for name, text in d["counters"]:
            _write(pdir / name, text)
            if d["unreadable"]:
                with contextlib.suppress(OSError):
                    os.chmod(pdir / name, 0)
    if d["device_link"] is not None:
        _link(dev_dir / "device", d["device_link"], parent, root)
    if where != "nowhere" and dev_dir.parent != root / "class" / "infiniband":
        _link(root / "class" / "infiniband" / d["name"], "parent", dev_dir, root)
    elif where == "nowhere":
        # The class entry points at nothing at all.
        with contextlib.suppress(OSError):
            if not dev_dir.exists():
                (root / "class" / "infiniband" / d["name"]).symlink_to(root / "gone")


def _tree(root: Path, spec: dict[str, Any]) -> None:
    for sub in ("class/infiniband", "class/net", "bus/pci/devices", "devices/system/node"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    _write(root / "devices" / "system" / "node" / "online", "0-1")
    for node, text in spec["nodes"]:
        _write(root / "devices" / "system" / "node" / node / "cpulist", text)
    for d in spec["devices"]:
        _place(root, d)


def _discover_within(root: Path, limit_s: float = 60.0) -> Topology:
    """Discovery in a thread: a hang fails the test at ``limit_s`` instead of stalling it."""
    out: list[Topology] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(discover(root, {}, use_nvml=False, watched=WATCHED))
        except BaseException as exc:  # reported below, with the tree that caused it
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), "discovery did not return"
    if errors:
        raise errors[0]
    return out[0]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    spec=st.fixed_dictionaries(
        {
            "devices": st.lists(rdma_device(), max_size=4),
            "nodes": st.lists(
                st.tuples(st.sampled_from(["node0", "node1", "node99999", "node1x"]), TEXTS),
                max_size=3,
            ),
        }
    )
)
def test_discovery_of_any_sysfs_shaped_tree_is_total_and_well_formed(spec: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="rofuzz") as tmp:
        root = Path(tmp) / "sys"
        _tree(root, spec)
        topo = _discover_within(root)
        for r in topo.rnics:
            for pci in (r.pci, r.physfn, *r.members):
                assert pci is None or SERVICE_PCI.match(pci), (r.name, pci)
            assert r.kind in {"physical", "sf", "vf", "bond", "soft"}
        for g in topo.gpus:
            assert SERVICE_PCI.match(g.pci)
        body = topo.payload()
        for g in body["gpus"]:
            g["nvlink"] = bool(g["nvlink"])  # as the runner sends it
        NodeIn.model_validate(body)
