"""Collectors on real fixture files: parsing, transitions, deltas, isolation."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from agent.collectors.base import Collected, CollectorContext
from agent.collectors.catalog import REGISTRY as COLLECTORS
from agent.collectors.counters import CountersCollector, counter_delta, saturation_value
from agent.collectors.pcie import PcieCollector
from agent.collectors.ports import PortsCollector
from agent.collectors.supervise import Supervisor
from agent.collectors.topology import TopologyCollector
from agent.config import AgentSettings
from agent.railmap import RailMapError, load_rail_map
from agent.sysfs import parse_int, parse_link_speed, parse_rate, parse_state, read_attr
from agent.topology import Topology
from railover_testing.agents import AgentThread, StandInService, settings_for
from railover_testing.sysfs_faults import (
    bump_counter,
    degrade_pcie_link,
    restore_pcie_link,
    set_counter,
    set_port_rate,
    set_port_state,
)
from railover_testing.sysfs_node import FixtureNode
from railover_testing.waiting import wait_until


def _ctx(
    node: FixtureNode, tmp_path: Path, state: dict[str, Any] | None = None
) -> tuple[CollectorContext, Topology]:
    """A context for collectors on ``node``'s tree, and the snapshot discovery takes of it."""
    settings = AgentSettings(
        service_url="http://127.0.0.1:1",
        node_name="n0",
        sysfs_root=node.root,
        proc_root=tmp_path,
        spool_dir=tmp_path / "spool",
    )
    saved = state if state is not None else {}
    ctx = CollectorContext(settings, {}, saved.get)
    topo = TopologyCollector(ctx).collect(None).topology
    assert topo is not None
    return ctx, topo


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("4: ACTIVE", (4, "ACTIVE")),
        ("1: DOWN", (1, "DOWN")),
        ("5: LinkUp", (5, "LinkUp")),
        ("7: Phy Test", (7, "Phy Test")),
        ("garbage", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_state(text: str | None, want: tuple[int, str] | None) -> None:
    assert parse_state(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("400 Gb/sec (4X NDR)", 400.0),
        ("200 Gb/sec (4X HDR)", 200.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("14 Gb/sec (1X FDR)", 14.0),
        ("Unknown", None),
    ],
)
def test_parse_rate(text: str, want: float | None) -> None:
    assert parse_rate(text) == want


def test_parse_link_speed_and_int() -> None:
    assert parse_link_speed("16.0 GT/s PCIe") == 16.0
    assert parse_link_speed("8 GT/s") == 8.0
    assert parse_link_speed("Unknown") is None
    assert parse_int("N/A (no PMA)") is None
    assert parse_int("0x10") == 16
    assert parse_int("123") == 123


def test_counter_delta_saturates_not_wraps() -> None:
    top = saturation_value("link_downed")
    assert top == 255
    assert counter_delta(250, 255, top) == (5, False, True)
    # Stuck at the top: no new information, no phantom delta.
    assert counter_delta(255, 255, top) == (0, False, True)
    # Reset (perfquery -R): count from zero, never 2**8 - prev + cur.
    assert counter_delta(200, 3, top) == (3, True, False)
    assert counter_delta(10, 12, None) == (2, False, False)


@given(st.integers(0, 2**64), st.integers(0, 2**64))
def test_counter_delta_is_never_negative_nor_larger_than_value(prev: int, cur: int) -> None:
    delta, reset, _ = counter_delta(prev, cur, saturation_value("symbol_error"))
    assert 0 <= delta <= cur
    assert reset == (cur < prev)


def test_port_down_and_up(node_a: FixtureNode, tmp_path: Path) -> None:
    ctx, topo = _ctx(node_a, tmp_path)
    ports = PortsCollector(ctx)
    first = ports.collect(topo)
    assert first.events == []  # baseline: the registration carries the state
    assert set(first.state["ports"].values()) == {"ACTIVE"}
    set_port_state(node_a.root, "mlx5_2", 1, "DOWN")
    got = ports.collect(topo)
    assert [(e["kind"], e["device"], e["port"]) for e in got.events] == [("port_down", "mlx5_2", 1)]
    assert got.events[0]["detail"] == {
        "state": "DOWN",
        "previous_state": "ACTIVE",
        "phys_state": "Disabled",
    }
    assert got.state["ports"]["mlx5_2/1"] == "DOWN"
    assert ports.collect(topo).events == []  # no repeat while it stays down
    set_port_state(node_a.root, "mlx5_2", 1, "INIT")
    assert ports.collect(topo).events == []  # still not ACTIVE
    set_port_state(node_a.root, "mlx5_2", 1, "ACTIVE")
    up = ports.collect(topo).events
    assert [e["kind"] for e in up] == ["port_up"]
    assert (
        REGISTRY.get_sample_value("railover_agent_port_active", {"device": "mlx5_2", "port": "1"})
        == 1.0
    )


def test_port_rate_changes_are_reported_while_the_port_is_active(
    node_a: FixtureNode, tmp_path: Path
) -> None:
    ctx, topo = _ctx(node_a, tmp_path)
    ports = PortsCollector(ctx)
    assert ports.collect(topo).events == []  # baseline: the registration carries the rate
    was = parse_rate(read_attr(str(node_a.root / "class/infiniband/mlx5_3/ports/1/rate")))
    set_port_rate(node_a.root, "mlx5_3", 1, 200)
    (ev,) = ports.collect(topo).events
    assert (ev["kind"], ev["device"], ev["port"], ev["rate_gbps"]) == (
        "port_rate",
        "mlx5_3",
        1,
        200,
    )
    assert ev["detail"] == {"previous_gbps": was}
    assert ports.collect(topo).events == []
    # Down, a port's rate says nothing; back up at full rate, that is reported.
    set_port_state(node_a.root, "mlx5_3", 1, "DOWN")
    set_port_rate(node_a.root, "mlx5_3", 1, 10)
    assert [e["kind"] for e in ports.collect(topo).events] == ["port_down"]
    set_port_state(node_a.root, "mlx5_3", 1, "ACTIVE")
    assert was is not None
    set_port_rate(node_a.root, "mlx5_3", 1, was)
    got = ports.collect(topo).events
    assert [(e["kind"], e.get("rate_gbps")) for e in got] == [("port_rate", was), ("port_up", None)]


def test_port_state_survives_restart(node_a: FixtureNode, tmp_path: Path) -> None:
    ctx, topo = _ctx(node_a, tmp_path)
    saved = PortsCollector(ctx).collect(topo).state
    # Agent away; the port goes down meanwhile; the new agent must still report it.
    set_port_state(node_a.root, "mlx5_5", 1, "DOWN")
    again = PortsCollector(_ctx(node_a, tmp_path, saved)[0])
    assert [e["kind"] for e in again.collect(topo).events] == ["port_down"]


def test_counters(node_a: FixtureNode, tmp_path: Path) -> None:
    ctx, topo = _ctx(node_a, tmp_path)
    c = CountersCollector(ctx)
    assert c.collect(topo).events == []
    bump_counter(node_a.root, "mlx5_0", 1, "link_downed", 3)
    bump_counter(node_a.root, "mlx5_0", 1, "local_ack_timeout_err", 7)  # in hw_counters
    bump_counter(node_a.root, "mlx5_0", 1, "port_xmit_data", 10**9)  # traffic: not watched
    evs = c.collect(topo).events
    got = sorted((e["counter"], e["delta"], e["detail"]["group"]) for e in evs)
    assert got == [("link_downed", 3, "counters"), ("local_ack_timeout_err", 7, "hw_counters")]
    assert all(e["kind"] == "counter" and e["device"] == "mlx5_0" for e in evs)
    assert c.collect(topo).events == []
    # Saturation: the 8-bit link_downed sticks at 255.
    set_counter(node_a.root, "mlx5_0", 1, "link_downed", 255)
    (ev,) = c.collect(topo).events
    assert (ev["delta"], ev["detail"]["saturated"]) == (252, True)
    # Reset by an operator: delta is the new count.
    set_counter(node_a.root, "mlx5_0", 1, "link_downed", 2)
    (ev,) = c.collect(topo).events
    assert (ev["delta"], ev["detail"]["reset"]) == (2, True)


def test_counters_skip_no_pma(node_a: FixtureNode, tmp_path: Path) -> None:
    ctx, topo = _ctx(node_a, tmp_path)
    c = CountersCollector(ctx)
    c.collect(topo)
    # mlx5_8 is RoCE: link_downed reads "N/A (no PMA)" and is never an event.
    keys = [k for k in c.last if k.startswith("mlx5_8/")]
    assert "mlx5_8/1/link_downed" not in keys
    assert "mlx5_8/1/req_cqe_error" in keys
    bump_counter(node_a.root, "mlx5_8", 1, "req_cqe_error", 1)
    assert [e["counter"] for e in c.collect(topo).events] == ["req_cqe_error"]


def test_pcie_degrade(node_a: FixtureNode, tmp_path: Path) -> None:
    ctx, topo = _ctx(node_a, tmp_path)
    p = PcieCollector(ctx)
    assert p.collect(topo).events == []
    rnic = node_a.rnic("mlx5_4")
    degrade_pcie_link(node_a.root, rnic.pci, width=8)
    (ev,) = p.collect(topo).events
    assert ev["kind"] == "pcie_degraded"
    assert ev["device"] == "mlx5_4"
    assert ev["detail"]["current_width"] == 8 and ev["detail"]["max_width"] == 16
    assert p.collect(topo).events == []
    degrade_pcie_link(node_a.root, rnic.pci, speed="16.0 GT/s PCIe")
    (ev,) = p.collect(topo).events  # trained down further: a new event
    assert ev["detail"]["current_speed_gts"] == 16.0
    restore_pcie_link(node_a.root, rnic.pci)
    (ev,) = p.collect(topo).events  # back at x16: the link's level, once
    assert (ev["detail"]["current_width"], ev["detail"]["restored"]) == (16, True)
    assert p.collect(topo).events == []
    gpu = node_a.gpus[3]
    degrade_pcie_link(node_a.root, gpu.pci, width=4)
    (ev,) = p.collect(topo).events
    assert "device" not in ev and ev["detail"]["gpu"] == 3


def test_collectors_are_registered_by_name() -> None:
    assert {"topology", "ports", "counters", "pcie"} <= set(COLLECTORS)


def test_rail_map_files(tmp_path: Path) -> None:
    j = tmp_path / "r.json"
    j.write_text(json.dumps({"mlx5_0/1": {"switch": "rail0-a", "rail": 0}}))
    y = tmp_path / "r.yaml"
    y.write_text("mlx5_1/1: {switch: rail1-a, rail: 1}\n")
    assert load_rail_map(j)[("mlx5_0", 1)].switch == "rail0-a"
    assert load_rail_map(y)[("mlx5_1", 1)].rail == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("mlx5_0: {switch: x, rail: 0}\n")
    with pytest.raises(RailMapError, match="bad key 'mlx5_0'"):
        load_rail_map(bad)
    bad.write_text("mlx5_0/1: {switch: x, rail: -1}\n")
    with pytest.raises(RailMapError, match="rail"):
        load_rail_map(bad)
    bad.write_text("[1, 2")
    with pytest.raises(RailMapError, match="not valid"):
        load_rail_map(bad)


# --- the topology snapshot and the supervisor ------------------------------------------------


def test_collectors_read_the_snapshot_they_are_given(node_a: FixtureNode, tmp_path: Path) -> None:
    ctx, topo = _ctx(node_a, tmp_path)
    with pytest.raises(FrozenInstanceError):
        topo.rnics = ()  # type: ignore[misc]  # a snapshot is a value: it cannot change under a run
    without = Topology(gpus=topo.gpus, rnics=tuple(r for r in topo.rnics if r.name != "mlx5_2"))
    ports = PortsCollector(ctx)
    ports.collect(without)
    set_port_state(node_a.root, "mlx5_2", 1, "DOWN")
    set_port_state(node_a.root, "mlx5_0", 1, "DOWN")
    # Only the ports of the snapshot this run was handed are read.
    assert [e["device"] for e in ports.collect(without).events] == ["mlx5_0"]
    # PCIe places come from discovery: no snapshot yet, nothing watched; with one, seen.
    pcie = PcieCollector(ctx)
    degrade_pcie_link(node_a.root, node_a.rnic("mlx5_4").pci, width=8)
    assert pcie.collect(None).events == []
    assert [e["device"] for e in pcie.collect(topo).events] == ["mlx5_4"]


def test_first_round_discovers_before_the_others_whatever_the_order(
    node_a: FixtureNode, tmp_path: Path
) -> None:
    ctx, _ = _ctx(node_a, tmp_path)
    degrade_pcie_link(node_a.root, node_a.rnic("mlx5_4").pci, width=8)
    delivered: list[tuple[str, Collected]] = []
    # Topology listed last, as registration (import) order happens to put it.
    supervisor = Supervisor(
        [PcieCollector(ctx), PortsCollector(ctx), TopologyCollector(ctx)],
        lambda c, got: delivered.append((c.name, got)),
    )
    try:
        asyncio.run(supervisor.first_round())
    finally:
        supervisor.close()
    assert next(name for name, _ in delivered) == "topology"
    assert supervisor.topology is not None and len(supervisor.topology.rnics) == 10
    (pcie,) = [got for name, got in delivered if name == "pcie"]
    # The PCIe collector had the snapshot on its very first run.
    assert [e["kind"] for e in pcie.events] == ["pcie_degraded"]
    for name in ("topology", "pcie", "ports"):
        assert (
            REGISTRY.get_sample_value("railover_agent_collector_success", {"collector": name}) == 1
        )


class _WedgedAttribute:
    """A sysfs attribute that blocks its readers in open(), as a hung driver's would.

    A FIFO does exactly that until a writer opens it; ``release`` opens one (which
    lets a blocked reader through, to read end-of-file) and puts a plain file back.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.text = path.read_text()
        path.unlink()
        os.mkfifo(path)
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        try:
            fd: int | None = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            fd = None  # no reader blocked right now
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(self.text)
        tmp.replace(self.path)
        if fd is not None:
            os.close(fd)


def _success(name: str) -> float | None:
    return REGISTRY.get_sample_value("railover_agent_collector_success", {"collector": name})


def test_a_stuck_read_times_out_its_collector_and_port_down_still_arrives(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, standin: StandInService
) -> None:
    settings = settings_for(node_a.root, tmp_path, standin.url, rail_map_a, collector_timeout_s=0.5)
    agent = AgentThread(settings).start()
    attr = node_a.root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    wedged = _WedgedAttribute(attr.resolve() / "link_downed")
    try:
        # The counters collector's next run opens the FIFO and never returns by itself.
        assert wait_until(lambda: _success("counters") == 0.0, timeout=20)
        set_port_state(node_a.root, "mlx5_3", 1, "DOWN")
        assert standin.wait_for(
            lambda st: any(
                e["kind"] == "port_down" and e["device"] == "mlx5_3" for e in st.events.values()
            ),
            timeout=20,
        )
        # Port-down went through while the counters read was still stuck.
        assert _success("counters") == 0.0
        assert _success("ports") == 1.0
        # The stuck run reads mlx5_1 only after mlx5_0: what it finds there once
        # released is delivered though it came late (the collector has moved on).
        bump_counter(node_a.root, "mlx5_1", 1, "link_downed", 2)
        wedged.release()
        assert standin.wait_for(
            lambda st: any(
                e["kind"] == "counter" and e["device"] == "mlx5_1" for e in st.events.values()
            ),
            timeout=20,
        )
        # Its stuck run returned, and the runs after it succeed again.
        assert wait_until(lambda: _success("counters") == 1.0, timeout=20)
    finally:
        wedged.release()
        agent.stop()
