"""Discovery on fixture trees laid out like real HGX-class machines."""

from __future__ import annotations

import os
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import ClassVar

import pytest

from agent import topology as topo_mod
from agent.railmap import load_rail_map
from agent.sysfs import normalise_pci
from agent.topology import PciTree, discover
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import FixtureNode, build_cluster, rail_node
from scheduler_svc.api.schemas.nodes import NodeIn
from scheduler_svc.engine import paths


def _by_switch(node_topo: topo_mod.Topology) -> dict[str | None, tuple[list[int], list[str]]]:
    groups: dict[str | None, tuple[list[int], list[str]]] = defaultdict(lambda: ([], []))
    for g in node_topo.gpus:
        groups[g.pcie_switch][0].append(g.index)
    for r in node_topo.rnics:
        groups[r.pcie_switch][1].append(r.name)
    return dict(groups)


def test_fixture_is_laid_out_like_linux(node_a: FixtureNode) -> None:
    root = node_a.root
    link = root / "class" / "infiniband" / "mlx5_0"
    assert link.is_symlink()
    assert os.readlink(link).startswith("../../devices/pci0000:")
    real = Path(os.path.realpath(link / "device"))
    assert real.name == node_a.rnic("mlx5_0").pci
    assert (real / "vendor").read_text() == "0x15b3\n"
    assert (link / "ports" / "1" / "state").read_text() == "4: ACTIVE\n"
    assert (link / "ports" / "1" / "rate").read_text() == "400 Gb/sec (4X NDR)\n"
    assert (root / "class" / "net" / "ib0").is_symlink()
    assert (root / "bus" / "pci" / "devices" / node_a.gpus[0].pci).resolve().is_dir()
    assert (root / "devices" / "system" / "node" / "node1" / "cpulist").read_text() == (
        "56-111,168-223\n"
    )
    # RoCE storage NICs have no PMA behind the IB counters, as on real mlx5.
    roce = root / "class" / "infiniband" / "mlx5_8" / "ports" / "1"
    assert (roce / "counters" / "link_downed").read_text() == "N/A (no PMA)\n"


def test_shape_a_grouping(node_a: FixtureNode, rail_map_a: Path) -> None:
    t = discover(node_a.root, load_rail_map(rail_map_a), use_nvml=False)
    assert [g.pci for g in t.gpus] == [g.pci for g in node_a.gpus]
    assert len(t.gpus) == 8
    assert len(t.rnics) == 10
    groups = _by_switch(t)
    # 4 PCIe switches, each with 2 GPUs and 2 RNICs; storage NICs on root ports.
    switched = {k: v for k, v in groups.items() if k is not None}
    assert len(switched) == 4
    assert all(len(g) == 2 and len(r) == 2 for g, r in switched.values())
    assert sorted(groups[None][1]) == ["mlx5_8", "mlx5_9"]
    assert groups[None][0] == []
    for want in node_a.gpus:
        got = t.gpus[want.index]
        assert (got.pci, got.numa, got.pcie_switch, got.root_complex) == (
            want.pci,
            want.numa,
            want.pcie_switch,
            want.root_complex,
        )
        assert got.nvlink is True  # NVSwitches present on the board
    numa_of_gpu = {g.index: g.numa for g in t.gpus}
    assert numa_of_gpu == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}
    for r in t.rnics:
        want_r = node_a.rnic(r.name)
        assert (r.pci, r.numa, r.pcie_switch, r.root_complex, r.netdev) == (
            want_r.pci,
            want_r.numa,
            want_r.pcie_switch,
            want_r.root_complex,
            want_r.netdev,
        )
        assert r.state == "ACTIVE"
        if want_r.storage:
            assert (r.switch, r.rail, r.link_layer, r.rate_gbps) == (None, None, "Ethernet", 200)
        else:
            assert r.link_layer == "InfiniBand"
            assert r.rate_gbps == 400
            assert r.switch == f"rail{r.rail}-a"
    # Each switch has its own root complex in this shape.
    assert len({r.root_complex for r in t.rnics}) == 6


def test_shape_b_two_gpus_per_rnic(node_b: FixtureNode) -> None:
    t = discover(node_b.root, {}, use_nvml=False)
    assert len(t.gpus) == 8
    assert len(t.rnics) == 4
    groups = _by_switch(t)
    assert len(groups) == 4
    assert all(len(g) == 2 and len(r) == 1 for g, r in groups.values())
    # Two switches share each root complex (one per NUMA node).
    rc_by_numa: dict[int | None, set[str | None]] = defaultdict(set)
    for r in t.rnics:
        rc_by_numa[r.numa].add(r.root_complex)
    assert {k: len(v) for k, v in rc_by_numa.items()} == {0: 1, 1: 1}
    assert all(r.switch is None and r.rail is None for r in t.rnics)


def test_payload_is_what_the_service_accepts(node_a: FixtureNode, rail_map_a: Path) -> None:
    t = discover(node_a.root, load_rail_map(rail_map_a), use_nvml=False)
    body = NodeIn.model_validate(t.payload())
    assert len(body.rnics) == 10
    storage = [r for r in body.rnics if r.switch is None]
    assert sorted(r.name for r in storage) == ["mlx5_8", "mlx5_9"]


def test_backup_plan_for_shape_a_stays_behind_the_root_complex(
    node_a: FixtureNode, rail_map_a: Path
) -> None:
    t = discover(node_a.root, load_rail_map(rail_map_a), use_nvml=False)
    node = paths.NodeTopology(
        name="n0",
        gpus=tuple(
            paths.Gpu(
                index=g.index,
                pci=g.pci,
                numa=g.numa,
                pcie_switch=g.pcie_switch,
                root_complex=g.root_complex,
                nvlink=bool(g.nvlink),
            )
            for g in t.gpus
        ),
        rnics=tuple(
            paths.Rnic(
                name=r.name,
                port=r.port,
                pci=r.pci,
                numa=r.numa,
                pcie_switch=r.pcie_switch,
                root_complex=r.root_complex,
                rate_gbps=r.rate_gbps or 0.0,
                switch=r.switch,
                rail=r.rail,
            )
            for r in t.rnics
        ),
    )
    plan = paths.plan_node(node)
    # The engine names RNIC ports "device/port".
    rc = {r.key: r.root_complex for r in t.rnics}
    gpu_rc = {g.index: g.root_complex for g in t.gpus}
    storage = {"mlx5_8/1", "mlx5_9/1"}
    for gp in plan.gpus:
        assert gp.primary not in storage and gp.backup not in storage
        assert gp.backup is not None
        # Every switch holds two GPU RNICs, so a backup behind the same root complex exists.
        assert rc[gp.backup] == gpu_rc[gp.gpu], gp


def test_nvml_bus_ids_are_normalised() -> None:
    assert normalise_pci("00000000:07:00.0") == "0000:07:00.0"
    assert normalise_pci(b"00000000:B7:00.0") == "0000:b7:00.0"
    assert normalise_pci("00000001:1A:00.1") == "0001:1a:00.1"


def test_nvml_is_used_when_present(node_a: FixtureNode, monkeypatch: pytest.MonkeyPatch) -> None:
    # NVML numbers GPUs its own way and spells bus ids "00000000:17:00.0"; the
    # agent must take NVML's index and map the bus id onto the sysfs tree.
    order = list(reversed(node_a.gpus))

    class FakeNvml(types.ModuleType):
        calls: ClassVar[list[str]] = []

        def nvmlInit(self) -> None:
            self.calls.append("init")

        def nvmlShutdown(self) -> None:
            self.calls.append("shutdown")

        def nvmlDeviceGetCount(self) -> int:
            return len(order)

        def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
            return i

        def nvmlDeviceGetPciInfo(self, h: int) -> types.SimpleNamespace:
            return types.SimpleNamespace(busId=("0000" + order[h].pci).upper().encode())

        def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
            if h % 2:
                raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
            return 1

    fake = FakeNvml("pynvml")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    t = discover(node_a.root, {}, use_nvml=True)
    assert "nvml" in t.sources
    assert [g.pci for g in t.gpus] == [g.pci for g in order]
    assert [g.nvlink for g in t.gpus] == [i % 2 == 0 for i in range(8)]
    assert t.gpus[0].pcie_switch == order[0].pcie_switch
    assert fake.calls == ["init", "shutdown"]


def test_nvml_failure_falls_back_to_sysfs(
    node_a: FixtureNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken(types.ModuleType):
        def nvmlInit(self) -> None:
            raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

    monkeypatch.setitem(sys.modules, "pynvml", Broken("pynvml"))
    t = discover(node_a.root, {}, use_nvml=True)
    assert t.sources == ("sysfs",)
    assert len(t.gpus) == 8


def test_unknown_numa_falls_back_to_cpu_affinity(node_a: FixtureNode) -> None:
    pci = node_a.rnic("mlx5_7").pci
    dev = (node_a.root / "bus" / "pci" / "devices" / pci).resolve()
    (dev / "numa_node").write_text("-1\n")
    place = PciTree(node_a.root).place(str(dev))
    assert place.numa == 1


def test_rail_cluster_builder(tmp_path: Path) -> None:
    nodes = build_cluster(tmp_path, ["n0", "n1", "n2", "n3"])
    for name, (fx, rail_file) in nodes.items():
        t = discover(fx.root, load_rail_map(rail_file), use_nvml=False)
        assert len(t.gpus) == 8, name
        assert sorted(r.rail for r in t.rnics if r.rail is not None) == list(range(8))
    with pytest.raises(ValueError, match="divide evenly"):
        rail_node(tmp_path / "bad", gpus=8, rnics=6, switches=4)


def test_fingerprint_ignores_port_state(node_a: FixtureNode) -> None:
    before = discover(node_a.root, {}, use_nvml=False)
    set_port_state(node_a.root, "mlx5_3", 1, "DOWN")
    after = discover(node_a.root, {}, use_nvml=False)
    assert after.rnics[3].state == "DOWN"
    assert before.fingerprint() == after.fingerprint()
