"""Discovery and planning on the second shape: dual-port RNICs, 4 cards for 8 GPUs,
storage NICs, and a PCI domain wider than four hex digits."""

from __future__ import annotations

import os
from pathlib import Path

from agent.railmap import load_rail_map
from agent.topology import Topology, discover
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import FixtureNode, shape_c, write_rail_map
from scheduler_svc.api.schemas.nodes import NodeIn
from scheduler_svc.engine import paths


def discovered(tmp_path: Path) -> tuple[FixtureNode, Topology]:
    node = shape_c(tmp_path / "sys")
    rail_map = write_rail_map(tmp_path / "rails.json", node.rail_map())
    return node, discover(node.root, load_rail_map(rail_map), use_nvml=False)


def test_fixture_lays_out_dual_port_cards_like_linux(tmp_path: Path) -> None:
    node = shape_c(tmp_path / "sys")
    ports = node.root / "class" / "infiniband" / "mlx5_0" / "ports"
    assert sorted(os.listdir(ports)) == ["1", "2"]
    real = Path(os.path.realpath(node.root / "class" / "infiniband" / "mlx5_0" / "device"))
    assert real.name == "10000:19:00.0"
    assert os.readlink(node.root / "class" / "infiniband" / "mlx5_0").startswith(
        "../../devices/pci10000:14/"
    )
    # One netdev per port, told apart by dev_port as mlx5 does.
    assert {p.name: (p / "dev_port").read_text() for p in (real / "net").iterdir()} == {
        "ib0": "0\n",
        "ib1": "1\n",
    }
    assert node.rnic("mlx5_0").ports == (1, 2)
    assert node.rnic("mlx5_4").ports == (1,)
    # Rails: one per GPU-fabric port, storage NICs left out.
    assert node.rail_map()["mlx5_0/2"] == {"switch": "rail1-a", "rail": 1}
    assert len(node.rail_map()) == 8


def test_discovery_finds_both_ports_and_their_netdevs(tmp_path: Path) -> None:
    node, t = discovered(tmp_path)
    assert [g.pci for g in t.gpus] == [g.pci for g in node.gpus]
    assert all(g.pci.startswith("10000:") for g in t.gpus)
    assert [(r.name, r.port, r.netdev, r.rail) for r in t.rnics] == [
        ("mlx5_0", 1, "ib0", 0),
        ("mlx5_0", 2, "ib1", 1),
        ("mlx5_1", 1, "ib2", 2),
        ("mlx5_1", 2, "ib3", 3),
        ("mlx5_2", 1, "ib4", 4),
        ("mlx5_2", 2, "ib5", 5),
        ("mlx5_3", 1, "ib6", 6),
        ("mlx5_3", 2, "ib7", 7),
        ("mlx5_4", 1, "ens1f0np0", None),
        ("mlx5_5", 1, "ens2f0np0", None),
    ]
    # Both ports of a card share its PCI function and place.
    p1, p2 = t.rnics[0], t.rnics[1]
    assert (p1.pci, p1.pcie_switch, p1.root_complex) == (p2.pci, p2.pcie_switch, p2.root_complex)
    assert p1.root_complex == "pci10000:14"
    assert t.gpus[0].pcie_switch == p1.pcie_switch
    # Two switches share each root complex.
    assert len({r.root_complex for r in t.rnics[:8]}) == 2
    assert len({r.pcie_switch for r in t.rnics[:8]}) == 4


def test_one_port_down_is_seen_on_that_port_only(tmp_path: Path) -> None:
    node, _ = discovered(tmp_path)
    set_port_state(node.root, "mlx5_0", 2, "DOWN")
    rail_map = load_rail_map(tmp_path / "rails.json")
    t = discover(node.root, rail_map, use_nvml=False)
    assert {r.key: r.state for r in t.rnics[:2]} == {"mlx5_0/1": "ACTIVE", "mlx5_0/2": "DOWN"}


def test_service_accepts_the_registration(tmp_path: Path) -> None:
    _, t = discovered(tmp_path)
    reg = NodeIn.model_validate(t.payload())
    assert len(reg.rnics) == 10
    assert reg.gpus[0].pci == "10000:17:00.0"


def test_plan_from_discovery_keeps_each_backup_off_the_primarys_card(tmp_path: Path) -> None:
    _, t = discovered(tmp_path)
    node = paths.NodeTopology(
        "n0",
        tuple(
            paths.Gpu(g.index, g.pci, g.numa, g.pcie_switch, g.root_complex, bool(g.nvlink))
            for g in t.gpus
        ),
        tuple(
            paths.Rnic(
                r.name,
                r.port,
                r.pci,
                r.numa,
                r.pcie_switch,
                r.root_complex,
                r.rate_gbps or 0.0,
                r.switch,
                r.rail,
            )
            for r in t.rnics
        ),
    )
    plan = paths.plan_node(node)
    assert plan.warnings == ()
    card = {r.key: r.pci for r in t.rnics}
    for g in plan.gpus:
        assert g.primary is not None and g.backup is not None
        assert card[g.primary] != card[g.backup], g
        assert g.primary_cost == 0  # a port of the card behind the GPU's own switch
        assert g.backup_cost == 1  # the other card on the same root complex
        assert g.rail_disjoint
    assert [g.primary for g in plan.gpus] == [f"mlx5_{c}/{p}" for c in range(4) for p in (1, 2)]
