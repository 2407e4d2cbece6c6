"""Collectors at their edges, on the second shape (dual-port cards, counters not at zero)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY as PROM

from agent.collectors.base import REGISTRY, Collected, Collector, CollectorContext, register
from agent.collectors.counters import CountersCollector
from agent.collectors.pcie import PcieCollector
from agent.collectors.ports import PortsCollector
from agent.collectors.topology import TopologyCollector
from agent.config import AgentSettings
from agent.railmap import load_rail_map
from agent.topology import Topology, list_rnic_ports
from railover_testing.sysfs_faults import (
    bump_counter,
    degrade_pcie_link,
    set_counter,
    set_port_state,
)
from railover_testing.sysfs_node import FixtureNode, shape_c, write_rail_map


@pytest.fixture
def node(tmp_path: Path) -> FixtureNode:
    return shape_c(tmp_path / "sys")


def context(
    node: FixtureNode,
    tmp_path: Path,
    state: dict[str, Any] | None = None,
    rail_map: Path | None = None,
) -> CollectorContext:
    settings = AgentSettings(
        service_url="http://127.0.0.1:1",
        node_name="n7",
        sysfs_root=node.root,
        proc_root=tmp_path,
        spool_dir=tmp_path / "spool",
        rail_map=rail_map,
    )
    saved = state if state is not None else {}
    return CollectorContext(settings, load_rail_map(rail_map) if rail_map else {}, saved.get)


def discovered(ctx: CollectorContext) -> Topology:
    """The snapshot a first topology run hands the other collectors."""
    topology = TopologyCollector(ctx).collect(None).topology
    assert topology is not None
    return topology


# -- the registry and the context ----------------------------------------------------------------
def test_registering_a_name_twice_is_refused() -> None:
    class Probe(Collector):
        name = "probe-for-test"

        def collect(self, topology: Topology | None) -> Collected:
            return Collected()

    try:
        assert register(Probe) is Probe
        assert REGISTRY["probe-for-test"] is Probe
        with pytest.raises(ValueError, match=r"^collector 'probe-for-test' registered twice$"):
            register(Probe)
    finally:
        REGISTRY.pop("probe-for-test", None)


def test_context_names_the_node_and_lists_ports(node: FixtureNode, tmp_path: Path) -> None:
    ctx = context(node, tmp_path)
    assert ctx.event("port_down", device="mlx5_0", port=2)["node"] == "n7"
    c = PortsCollector(ctx)
    # No topology yet: the ports come straight from sysfs.
    assert c.rnic_ports(None) == list_rnic_ports(node.root)
    assert c.rnic_ports(None)[:2] == [("mlx5_0", 1), ("mlx5_0", 2)]
    topology = discovered(ctx)
    # Once discovered, from the topology (which leaves out what the rail map drops: nothing).
    assert c.rnic_ports(topology) == topology.rnic_ports()
    shutil.rmtree(node.root / "class" / "infiniband" / "mlx5_5" / "ports")
    assert ("mlx5_5", 1) in c.rnic_ports(topology)  # the snapshot's view until it is re-read
    assert ("mlx5_5", 1) not in c.rnic_ports(None)


# -- counters -------------------------------------------------------------------------------------
def test_a_reset_to_zero_is_no_event_and_the_next_counter_still_counts(
    node: FixtureNode, tmp_path: Path
) -> None:
    ctx = context(node, tmp_path)
    topo = discovered(ctx)
    c = CountersCollector(ctx)
    c.collect(topo)
    set_counter(node.root, "mlx5_0", 1, "link_downed", 0)  # perfquery -R: delta 0
    bump_counter(node.root, "mlx5_0", 1, "local_ack_timeout_err", 2)
    got = c.collect(topo)
    assert [(e["counter"], e["delta"]) for e in got.events] == [("local_ack_timeout_err", 2)]
    assert got.state["counters"]["mlx5_0/1/link_downed"] == 0


def test_counters_under_hw_counters_only_are_found(node: FixtureNode, tmp_path: Path) -> None:
    shutil.rmtree(node.root / "class" / "infiniband" / "mlx5_1" / "ports" / "2" / "counters")
    ctx = context(node, tmp_path)
    topo = discovered(ctx)
    c = CountersCollector(ctx)
    c.collect(topo)
    bump_counter(node.root, "mlx5_1", 2, "local_ack_timeout_err", 4, hw=True)
    (ev,) = c.collect(topo).events
    assert (ev["device"], ev["port"], ev["delta"]) == ("mlx5_1", 2, 4)
    assert ev["detail"]["group"] == "hw_counters"


# -- ports ----------------------------------------------------------------------------------------
def port_active(dev: str, port: int) -> float | None:
    return PROM.get_sample_value("railover_agent_port_active", {"device": dev, "port": str(port)})


def test_ports_state_metrics_and_details(node: FixtureNode, tmp_path: Path) -> None:
    ctx = context(node, tmp_path)
    topo = discovered(ctx)
    p = PortsCollector(ctx)
    first = p.collect(topo)
    assert first.events == []
    assert first.state["ports"]["mlx5_3/2"] == "ACTIVE"
    assert port_active("mlx5_3", 2) == 1.0
    assert p.collect(topo).state == {}  # nothing changed: nothing to save
    set_port_state(node.root, "mlx5_3", 2, "DOWN")
    os.remove(node.root / "class" / "infiniband" / "mlx5_3" / "ports" / "2" / "phys_state")
    (ev,) = p.collect(topo).events
    assert ev["detail"] == {"state": "DOWN", "previous_state": "ACTIVE", "phys_state": None}
    assert (port_active("mlx5_3", 2), port_active("mlx5_3", 1)) == (0.0, 1.0)


def test_a_vanished_device_does_not_hide_the_ports_after_it(
    node: FixtureNode, tmp_path: Path
) -> None:
    ctx = context(node, tmp_path)
    topo = discovered(ctx)
    p = PortsCollector(ctx)
    p.collect(topo)
    shutil.rmtree(node.root / "class" / "infiniband" / "mlx5_0" / "ports")
    set_port_state(node.root, "mlx5_2", 1, "DOWN")
    (ev,) = p.collect(topo).events
    assert (ev["kind"], ev["device"], ev["port"]) == ("port_down", "mlx5_2", 1)


# -- PCIe -----------------------------------------------------------------------------------------
def test_a_dual_port_card_is_one_pcie_device(node: FixtureNode, tmp_path: Path) -> None:
    ctx = context(node, tmp_path)
    topo = discovered(ctx)
    p = PcieCollector(ctx)
    assert p.collect(topo).events == []
    card = node.rnic("mlx5_0").pci
    degrade_pcie_link(node.root, card, width=8)
    got = p.collect(topo)
    (ev,) = got.events  # one function, two ports: one event
    assert ev["device"] == "mlx5_0"
    assert ev["detail"] == {
        "pci": card,
        "current_width": 8,
        "max_width": 16,
        "current_speed_gts": 32.0,
        "max_speed_gts": 32.0,
        "restored": False,
    }
    assert got.state == {"pcie": {card: "x8@32GT/s"}}
    assert p.collect(topo).state == {}  # unchanged
    # A second card trains down later: reported, although the first is still degraded.
    other = node.rnic("mlx5_3").pci
    degrade_pcie_link(node.root, other, width=4)
    later = p.collect(topo)
    assert [e["device"] for e in later.events] == ["mlx5_3"]
    assert later.state == {"pcie": {card: "x8@32GT/s", other: "x4@32GT/s"}}
    (node.root / "bus" / "pci" / "devices" / other / "current_link_width").write_text("16\n")
    p.collect(topo)
    # A restarted agent keeps what it reported: no second event for the same state.
    restarted = context(node, tmp_path, state={"pcie": got.state["pcie"]})
    topo = discovered(restarted)
    again = PcieCollector(restarted)
    assert again.collect(topo).events == []
    # Back to full width: one report of the link's level, and the saved state forgets it.
    (node.root / "bus" / "pci" / "devices" / card / "current_link_width").write_text("16\n")
    back = again.collect(topo)
    assert [(e["device"], e["detail"]["restored"]) for e in back.events] == [("mlx5_0", True)]
    assert back.state == {"pcie": {}}
    assert again.collect(topo) == Collected(events=[], state={})


def test_a_function_without_link_attributes_is_skipped_not_the_rest(
    node: FixtureNode, tmp_path: Path
) -> None:
    ctx = context(node, tmp_path)
    topo = discovered(ctx)
    p = PcieCollector(ctx)
    p.collect(topo)
    first = node.root / "bus" / "pci" / "devices" / node.rnic("mlx5_0").pci
    for attr in ("current_link_speed", "max_link_width"):
        (first / attr).write_text("Unknown\n")
    degrade_pcie_link(node.root, node.rnic("mlx5_1").pci, width=4)
    (ev,) = p.collect(topo).events
    assert ev["device"] == "mlx5_1"


@pytest.mark.parametrize(
    "attr", ["current_link_width", "max_link_width", "current_link_speed", "max_link_speed"]
)
def test_any_missing_link_attribute_skips_that_function(
    node: FixtureNode, tmp_path: Path, attr: str
) -> None:
    ctx = context(node, tmp_path)
    topo = discovered(ctx)
    p = PcieCollector(ctx)
    p.collect(topo)
    card = node.root / "bus" / "pci" / "devices" / node.rnic("mlx5_2").pci
    degrade_pcie_link(node.root, node.rnic("mlx5_2").pci, width=4, speed="16.0 GT/s PCIe")
    os.remove(card / attr)
    assert p.collect(topo).events == []


# -- topology and the rail map ---------------------------------------------------------------------
def test_an_edited_rail_map_is_reloaded_and_logged(
    node: FixtureNode, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rails = write_rail_map(tmp_path / "rails.json", node.rail_map())
    ctx = context(node, tmp_path, rail_map=rails)
    t = TopologyCollector(ctx)
    with caplog.at_level(logging.INFO, logger="agent.collectors.topology"):
        first = t.collect(None).topology  # the map it started with: not re-read
    # (The RoCE storage NICs' counters that cannot count are logged, once: not the map.)
    assert [r.getMessage() for r in caplog.records if "rail map" in r.getMessage()] == []
    assert first is not None and first.rnics[0].switch == "rail0-a"
    edited = node.rail_map()
    edited["mlx5_0/1"] = {"switch": "rail0-b", "rail": 0}
    old = rails.stat().st_mtime_ns
    rails.write_text(json.dumps(edited))
    os.utime(rails, ns=(old + 10**9, old + 10**9))
    with caplog.at_level(logging.INFO, logger="agent.collectors.topology"):
        reloaded = t.collect(first).topology
    assert t.rail_map[("mlx5_0", 1)].switch == "rail0-b"
    assert reloaded is not None and reloaded.rnics[0].switch == "rail0-b"
    assert first.rnics[0].switch == "rail0-a"  # the old snapshot is not changed under its holders
    assert [r.getMessage() for r in caplog.records if "rail map" in r.getMessage()] == [
        f"rail map {rails} reloaded"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="agent.collectors.topology"):
        t.collect(reloaded)  # unchanged file: not re-read
    assert caplog.records == []
