"""Discovery of every kind of RDMA device a GPU node has (issue 31): SF, VF, RoCE bond,
rxe, siw, an HCA without PMA counters, devices whose ``device`` link is missing or
dangles; counters that cannot count; devices that vanish."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY as PROM

from agent.collectors.base import CollectorContext
from agent.collectors.counters import CountersCollector
from agent.collectors.topology import STATE_KEY, TopologyCollector
from agent.config import AgentSettings
from agent.counter_files import resolve
from agent.railmap import load_rail_map
from agent.topology import Topology, discover
from railover_testing.sysfs_faults import set_counter
from railover_testing.sysfs_node import write_rail_map
from railover_testing.sysfs_rdma_kinds import KindsNode, kinds_node
from scheduler_svc.api.schemas.nodes import NodeIn

WATCHED = ("link_downed", "symbol_error", "req_cqe_error")


@pytest.fixture
def kn(tmp_path: Path) -> KindsNode:
    return kinds_node(tmp_path / "sys")


def _discover(kn: KindsNode, tmp_path: Path, watched: tuple[str, ...] = WATCHED) -> Topology:
    rails = load_rail_map(write_rail_map(tmp_path / "rails.json", kn.rail_map()))
    return discover(kn.root, rails, use_nvml=False, watched=watched)


def _ctx(kn: KindsNode, tmp_path: Path, state: dict[str, Any] | None = None) -> CollectorContext:
    settings = AgentSettings(
        service_url="http://127.0.0.1:1",
        node_name="n7",
        sysfs_root=kn.root,
        proc_root=tmp_path,
        spool_dir=tmp_path / "spool",
        counter_events=",".join(WATCHED),
    )
    return CollectorContext(settings, {}, (state or {}).get)


def test_each_kind_is_found_with_its_nearest_pci_function(kn: KindsNode, tmp_path: Path) -> None:
    topo = _discover(kn, tmp_path)
    got = {r.name: (r.kind, r.pci, r.physfn, r.members, r.netdev) for r in topo.rnics}
    want = {d.name: (d.kind, d.pci, d.physfn, d.members, d.netdev) for d in kn.devices.values()}
    assert got == want
    sf = next(r for r in topo.rnics if r.name == "mlx5_5")
    pf = next(r for r in topo.rnics if r.name == "mlx5_0")
    # An SF sits where its PF sits.
    assert (sf.numa, sf.pcie_switch, sf.root_complex) == (pf.numa, pf.pcie_switch, pf.root_complex)
    soft = [r for r in topo.rnics if r.kind == "soft"]
    assert {r.name for r in soft} == {"rxe0", "siw0"}
    assert all(r.pci is None and r.numa is None and r.pcie_switch is None for r in soft)


def test_the_registration_is_one_the_service_takes(kn: KindsNode, tmp_path: Path) -> None:
    body = NodeIn.model_validate(_discover(kn, tmp_path).payload())
    assert len(body.gpus) == 8 and len(body.rnics) == 10


def test_a_missing_or_dangling_device_link_falls_back_to_where_the_device_is(
    kn: KindsNode, tmp_path: Path
) -> None:
    ib = kn.root / "class" / "infiniband"
    (ib / "mlx5_2" / "device").unlink()  # a dump without the link
    (ib / "mlx5_3" / "device").unlink()
    (ib / "mlx5_3" / "device").symlink_to("../../../nowhere")  # dangling
    # A device copied into the class directory, no link at all (an old dump): no PCI.
    hfi = ib / "hfi1_0"
    shutil.copytree(ib / "mlx5_0", hfi, symlinks=True)
    (hfi / "device").unlink()
    topo = _discover(kn, tmp_path)
    by = {r.name: r for r in topo.rnics}
    assert by["mlx5_2"].pci == kn.devices["mlx5_2"].pci
    assert by["mlx5_3"].pci == kn.devices["mlx5_3"].pci
    assert (by["hfi1_0"].pci, by["hfi1_0"].kind) == (None, "physical")
    NodeIn.model_validate(topo.payload())


def test_counter_availability_says_why_a_counter_cannot_count(
    kn: KindsNode, tmp_path: Path
) -> None:
    topo = _discover(kn, tmp_path)
    by = {r.name: dict(r.counters) for r in topo.rnics}
    assert by["mlx5_0"] == dict.fromkeys(WATCHED, "available")
    no_pma = "unavailable (N/A (no PMA))"
    assert by["mlx5_4"] == {
        "link_downed": no_pma,
        "symbol_error": no_pma,
        "req_cqe_error": "available",
    }
    # rxe counts link_downed in hw_counters, has no PMA and no mlx5 transport counters.
    absent = "unavailable (not exposed by the driver)"
    assert by["rxe0"] == {
        "link_downed": "available",
        "symbol_error": absent,
        "req_cqe_error": absent,
    }
    assert set(by["siw0"].values()) == {absent}


def test_counters_ext_is_read_wide_first_and_counters_by_their_width(kn: KindsNode) -> None:
    port = kn.root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters_ext").mkdir()
    (port / "counters_ext" / "port_xmit_data_64").write_text("123456789012\n")
    cf, why = resolve(str(port), "port_xmit_data")
    assert why == "available" and cf is not None
    assert (cf.group, cf.width_bits, cf.saturation_value(123456789012)) == (
        "counters_ext",
        64,
        None,
    )
    cf, _ = resolve(str(port), "link_downed")
    assert cf is not None and (cf.group, cf.saturation_value(3)) == ("counters", 255)
    # A 32-bit PMA data counter that reads above 2**32 - 1 is the extended one: no limit.
    cf, _ = resolve(str(port), "port_rcv_data")
    assert cf is not None and cf.saturation_value(2**32) is None
    assert cf.saturation_value(7) == 2**32 - 1
    os.chmod(port / "counters" / "symbol_error", 0)
    unreadable = os.geteuid() != 0  # root reads anything
    cf, why = resolve(str(port), "symbol_error")
    if unreadable:
        assert cf is None and why == "unavailable (counters/symbol_error cannot be read)"


def test_a_watched_counter_only_in_counters_ext_raises_events(
    kn: KindsNode, tmp_path: Path
) -> None:
    port = kn.root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters_ext").mkdir()
    (port / "counters_ext" / "port_rcv_packets_64").write_text("5000000000\n")
    settings = _ctx(kn, tmp_path).settings.model_copy(
        update={"counter_events": ["port_rcv_packets"]}
    )
    c = CountersCollector(CollectorContext(settings, {}, lambda _key: None))
    topo = _discover(kn, tmp_path, ("port_rcv_packets",))
    assert c.collect(topo).events == []  # the baseline
    (port / "counters_ext" / "port_rcv_packets_64").write_text("5000000009\n")
    (ev,) = [e for e in c.collect(topo).events if e["device"] == "mlx5_0"]
    assert (ev["counter"], ev["delta"], ev["detail"]["group"]) == (
        "port_rcv_packets",
        9,
        "counters_ext",
    )
    assert (ev["detail"]["width_bits"], ev["detail"]["saturated"]) == (64, False)


def test_a_counter_that_cannot_count_is_a_metric_and_logged_once(
    kn: KindsNode, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = TopologyCollector(_ctx(kn, tmp_path))
    with caplog.at_level(logging.WARNING, logger="agent.collectors.topology"):
        first = t.collect(None).topology
        t.collect(first)
    lines = [r.getMessage() for r in caplog.records if "mlx5_4/1" in r.getMessage()]
    assert lines == [
        "counter link_downed on mlx5_4/1 can never report a rise: unavailable (N/A (no PMA))",
        "counter symbol_error on mlx5_4/1 can never report a rise: unavailable (N/A (no PMA))",
    ]

    def gauge(dev: str, counter: str) -> float | None:
        return PROM.get_sample_value(
            "railover_agent_port_statistic_available",
            {"device": dev, "port": "1", "counter": counter},
        )

    assert (gauge("mlx5_4", "symbol_error"), gauge("mlx5_4", "req_cqe_error")) == (0.0, 1.0)
    # The firmware learns to count: the gauge follows at the next discovery.
    set_counter(kn.root, "mlx5_4", 1, "symbol_error", 0)
    t.collect(first)
    assert gauge("mlx5_4", "symbol_error") == 1.0


def test_a_vanished_rnic_or_gpu_is_a_device_lost_event(kn: KindsNode, tmp_path: Path) -> None:
    t = TopologyCollector(_ctx(kn, tmp_path))
    first = t.collect(None)
    assert first.events == [] and STATE_KEY in first.state
    # The SF is deleted and a GPU falls off the bus (its bus entry and its device go).
    (kn.root / "class" / "infiniband" / "mlx5_5").unlink()
    gpu = kn.node.gpus[3]
    (kn.root / "bus" / "pci" / "devices" / gpu.pci).unlink()
    second = t.collect(first.topology)
    got = [(e["kind"], e.get("device"), e.get("gpu"), e["detail"]["pci"]) for e in second.events]
    # The GPU by its address and the index it had (those after it moved down one index).
    assert got == [
        ("device_lost", None, 3, gpu.pci),
        ("device_lost", "mlx5_5", None, kn.devices["mlx5_0"].pci),
    ]
    assert t.collect(second.topology).events == []  # reported once
    # An agent restarted while the GPU was gone still reports it, from the spool's state.
    (kn.root / "bus" / "pci" / "devices" / kn.node.gpus[5].pci).unlink()
    restarted = TopologyCollector(_ctx(kn, tmp_path, state=second.state))
    (ev,) = restarted.collect(None).events
    # GPU 5 of the tree was GPU 4 of the last snapshot (after GPU 3 went).
    assert (ev["kind"], ev["gpu"], ev["detail"]["pci"]) == ("device_lost", 4, kn.node.gpus[5].pci)


@pytest.mark.parametrize("names", ["link_downed,port-rcv", "link downed", ",".join(["c"] * 65)])
def test_a_counter_name_the_service_would_refuse_is_refused_at_start(
    names: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="counter"):
        AgentSettings(
            service_url="http://127.0.0.1:1",
            node_name="n7",
            sysfs_root=tmp_path,
            proc_root=tmp_path,
            spool_dir=tmp_path / "spool",
            counter_events=names,
        )
