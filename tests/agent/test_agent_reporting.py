"""The whole agent against a stand-in service over loopback HTTP."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

from prometheus_client import REGISTRY

from agent.events import new_event
from railover_testing.agents import AgentThread, StandInService, settings_for
from railover_testing.sysfs_faults import bump_counter, set_port_state
from railover_testing.sysfs_node import FixtureNode
from railover_testing.waiting import wait_until
from tests.agent.polls import PollLog


def test_registers_topology(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, standin: StandInService
) -> None:
    a = AgentThread(settings_for(node_a.root, tmp_path, standin.url, rail_map_a)).start()
    try:
        assert standin.wait_for(lambda s: "n0" in s.nodes)
        body = standin.state.nodes["n0"]
        assert len(body["gpus"]) == 8 and len(body["rnics"]) == 10
        r0 = next(r for r in body["rnics"] if r["name"] == "mlx5_0")
        assert r0 == {
            "name": "mlx5_0",
            "port": 1,
            "pci": node_a.rnic("mlx5_0").pci,
            "numa": 0,
            "pcie_switch": node_a.rnic("mlx5_0").pcie_switch,
            "root_complex": node_a.rnic("mlx5_0").root_complex,
            "rate_gbps": 400,
            "link_layer": "InfiniBand",
            "netdev": "ib0",
            "switch": "rail0-a",
            "rail": 0,
            "state": "ACTIVE",
            "kind": "physical",
            "physfn": None,
            "members": [],
            "counters": dict.fromkeys(a.settings.counter_events, "available"),
        }
        storage = [r for r in body["rnics"] if r["switch"] is None]
        assert sorted(r["name"] for r in storage) == ["mlx5_8", "mlx5_9"]
        assert all(r["rail"] is None for r in storage)
        assert body["gpus"][0]["nvlink"] is True
    finally:
        a.stop()


def test_port_down_is_seen_at_the_next_poll(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, standin: StandInService
) -> None:
    """Within one poll interval, counted in polls of the ports collector, not in seconds."""
    s = settings_for(node_a.root, tmp_path, standin.url, rail_map_a, poll_interval_s=1.0)
    a = AgentThread(s).start()
    try:
        polls = PollLog(a, "ports")
        assert standin.wait_for(lambda st: "n0" in st.nodes)
        before = polls.mark()
        set_port_state(node_a.root, "mlx5_3", 1, "DOWN")
        # Generous: the count below is the bound; this only stops a hung test.
        assert standin.wait_for(
            lambda st: any(e["kind"] == "port_down" for e in st.events.values()), timeout=30
        )
        # Found by the poll running at the flip, or else by the next one to start.
        found = polls.found_by(lambda e: e["kind"] == "port_down")
        assert found is not None
        assert before <= found <= before + 1
        (ev,) = [e for e in standin.state.events.values() if e["kind"] == "port_down"]
        assert (ev["node"], ev["device"], ev["port"]) == ("n0", "mlx5_3", 1)
    finally:
        a.stop()


def test_outage_then_restart_delivers_everything_once(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path
) -> None:
    svc = StandInService()
    port = svc.port
    state = svc.state
    svc.stop()  # service down from the start
    s = settings_for(node_a.root, tmp_path, f"http://127.0.0.1:{port}", rail_map_a)
    a = AgentThread(s).start()
    bump_counter(node_a.root, "mlx5_1", 1, "symbol_error", 4)
    set_port_state(node_a.root, "mlx5_6", 1, "DOWN")
    assert wait_until(lambda: a.agent.spool.depth() >= 2)
    a.stop()  # agent restarts while the service is still down
    a = AgentThread(s).start()
    set_port_state(node_a.root, "mlx5_6", 1, "ACTIVE")
    assert wait_until(lambda: a.agent.spool.depth() >= 3)
    svc = StandInService(port=port, state=state)
    try:
        assert svc.wait_for(lambda st: len(st.events) == 3, timeout=10)
        kinds = sorted(e["kind"] for e in state.events.values())
        assert kinds == ["counter", "port_down", "port_up"]
        assert wait_until(lambda: a.agent.spool.depth() == 0)
        assert state.duplicates == 0
    finally:
        a.stop()
        svc.stop()


def test_transient_errors_retry_and_rejected_events_are_set_aside(
    node_a: FixtureNode, tmp_path: Path, standin: StandInService
) -> None:
    a = AgentThread(settings_for(node_a.root, tmp_path, standin.url)).start()
    try:
        standin.state.fail_next = 2
        good = [new_event("n0", "counter", device="mlx5_0", counter="x", delta=1) for _ in range(5)]
        bad = new_event("n0", "counter", device="mlx5_0", counter="y", delta=1)
        standin.state.poison.add(bad["event_id"])
        a.call(lambda: a.agent._spool_events([*good[:2], bad, *good[2:]]))
        assert standin.wait_for(lambda st: len(st.events) == 5, timeout=10)
        assert wait_until(lambda: a.agent.spool.depth() == 0)
        letters = a.agent.spool.dead_letters()
        assert [ev["event_id"] for ev, _ in letters] == [bad["event_id"]]
        assert "422" in letters[0][1]
        # Order is kept for the good ones.
        assert standin.state.event_order == [e["event_id"] for e in good]
    finally:
        a.stop()


def test_metrics_and_health_endpoints(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, standin: StandInService
) -> None:
    s = settings_for(node_a.root, tmp_path, standin.url, rail_map_a, disabled_collectors="pcie")
    a = AgentThread(s).start()
    try:
        port = a.agent.metrics_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            health = json.loads(r.read())
        assert r.status == 200 and health["status"] == "ok"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        for name in ("topology", "ports", "counters", "plugin"):
            assert f'railover_agent_collector_success{{collector="{name}"}} 1.0' in text
        assert 'railover_agent_collector_success{collector="pcie"}' not in text
        assert "railover_agent_spool_events " in text
        assert 'railover_agent_collector_duration_seconds{collector="ports"}' in text
    finally:
        a.stop()


def test_failing_collector_is_isolated(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, standin: StandInService
) -> None:
    a = AgentThread(settings_for(node_a.root, tmp_path, standin.url, rail_map_a)).start()
    try:
        counters = next(c for c in a.agent.collectors if c.name == "counters")

        def boom() -> None:
            raise OSError("sysfs went away")

        counters.collect = boom  # type: ignore[method-assign,assignment]  # inject a failure
        assert wait_until(
            lambda: (
                REGISTRY.get_sample_value(
                    "railover_agent_collector_success", {"collector": "counters"}
                )
                == 0.0
            )
        )
        # The others go on: a port flip still arrives.
        set_port_state(node_a.root, "mlx5_0", 1, "DOWN")
        assert standin.wait_for(
            lambda st: any(e["kind"] == "port_down" for e in st.events.values())
        )
        assert (
            REGISTRY.get_sample_value("railover_agent_collector_success", {"collector": "ports"})
            == 1.0
        )
    finally:
        a.stop()


def test_reregisters_when_topology_changes(
    node_a: FixtureNode, tmp_path: Path, standin: StandInService
) -> None:
    rails = tmp_path / "rails.json"
    rails.write_text(json.dumps(node_a.rail_map()))
    s = settings_for(node_a.root, tmp_path, standin.url, rails, topology_interval_s=1.0)
    a = AgentThread(s).start()
    try:
        assert standin.wait_for(lambda st: "n0" in st.nodes)
        # A storage NIC's port disappears (e.g. the device was unbound).
        import shutil

        dev = (node_a.root / "class" / "infiniband" / "mlx5_9").resolve()
        shutil.rmtree(dev / "ports")
        assert standin.wait_for(lambda st: len(st.nodes["n0"]["rnics"]) == 9, timeout=5)
        # The rail map is edited in place (a ConfigMap update): recabled rail 0.
        rail_map = node_a.rail_map()
        rail_map["mlx5_0/1"] = {"switch": "rail0-b", "rail": 0}
        old = rails.stat().st_mtime_ns
        rails.write_text(json.dumps(rail_map))
        # A distinct mtime, set rather than waited for (coarse clocks can repeat one).
        os.utime(rails, ns=(old + 10**9, old + 10**9))
        assert standin.wait_for(
            lambda st: any(r["switch"] == "rail0-b" for r in st.nodes["n0"]["rnics"]), timeout=5
        )
        # A broken edit keeps the last good map and marks the collector failed.
        rails.write_text("{not json")
        assert wait_until(
            lambda: (
                REGISTRY.get_sample_value(
                    "railover_agent_collector_success", {"collector": "topology"}
                )
                == 0.0
            ),
            timeout=5,
        )
    finally:
        a.stop()
