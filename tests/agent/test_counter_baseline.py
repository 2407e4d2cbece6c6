"""Counters that are not zero when the agent starts: the first reading is a baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.collectors.base import CollectorContext
from agent.collectors.counters import STATE_KEY, CountersCollector
from agent.collectors.topology import TopologyCollector
from agent.config import AgentSettings
from agent.topology import Topology
from railover_testing.sysfs_faults import bump_counter, read_counter
from railover_testing.sysfs_node import FixtureNode, shape_c


def counters_for(
    node: FixtureNode, tmp_path: Path, state: dict[str, Any] | None = None
) -> tuple[CountersCollector, Topology]:
    """A counters collector and the snapshot a first discovery hands it."""
    settings = AgentSettings(
        service_url="http://127.0.0.1:1",
        node_name="n0",
        sysfs_root=node.root,
        proc_root=tmp_path,
        spool_dir=tmp_path / "spool",
    )
    saved = state if state is not None else {}
    ctx = CollectorContext(settings, {}, saved.get)
    topology = TopologyCollector(ctx).collect(None).topology
    assert topology is not None
    return CountersCollector(ctx), topology


def test_first_reading_of_nonzero_counters_is_a_baseline(tmp_path: Path) -> None:
    node = shape_c(tmp_path / "sys")
    assert read_counter(node.root, "mlx5_0", 2, "link_downed") == "17"
    assert read_counter(node.root, "mlx5_0", 2, "local_ack_timeout_err", hw=True) == "17"
    c, topo = counters_for(node, tmp_path)
    first = c.collect(topo)
    assert first.events == []
    # Every watched counter of every port, at its current value, is the baseline.
    assert first.state[STATE_KEY]["mlx5_0/2/link_downed"] == 17
    assert first.state[STATE_KEY]["mlx5_3/1/local_ack_timeout_err"] == 17
    assert {k.split("/")[0] for k in first.state[STATE_KEY]} == {f"mlx5_{i}" for i in range(6)}
    bump_counter(node.root, "mlx5_0", 2, "link_downed", 2)
    bump_counter(node.root, "mlx5_2", 1, "local_ack_timeout_err", 5)
    evs = sorted(c.collect(topo).events, key=lambda e: e["device"])
    # Deltas from the baseline, not the counters' values since boot.
    assert [
        (e["device"], e["port"], e["counter"], e["delta"], e["detail"]["value"]) for e in evs
    ] == [
        ("mlx5_0", 2, "link_downed", 2, 19),
        ("mlx5_2", 1, "local_ack_timeout_err", 5, 22),
    ]
    assert all(e["detail"]["reset"] is False for e in evs)


def test_a_restarted_agent_counts_from_its_saved_readings(tmp_path: Path) -> None:
    node = shape_c(tmp_path / "sys")
    c, topo = counters_for(node, tmp_path)
    saved = c.collect(topo).state
    # While the agent was down, the counter rose: the restarted agent reports that rise.
    bump_counter(node.root, "mlx5_1", 1, "link_downed", 4)
    restarted, topo = counters_for(node, tmp_path, saved)
    (ev,) = restarted.collect(topo).events
    assert (ev["device"], ev["port"], ev["counter"], ev["delta"]) == ("mlx5_1", 1, "link_downed", 4)
    assert restarted.collect(topo).events == []


def test_nothing_changed_means_no_state_to_save(tmp_path: Path) -> None:
    node = shape_c(tmp_path / "sys")
    c, topo = counters_for(node, tmp_path)
    c.collect(topo)
    again = c.collect(topo)
    assert again.events == []
    assert again.state == {}
