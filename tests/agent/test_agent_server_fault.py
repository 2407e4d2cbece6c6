"""A batch the service keeps failing on (HTTP 500) cannot wedge the agent's spool."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import REGISTRY

from agent.events import new_event
from railover_testing.agents import AgentThread, StandInService, settings_for
from railover_testing.sysfs_node import FixtureNode
from railover_testing.waiting import wait_until


def _dropped(kind: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "railover_agent_events_dropped_total", {"kind": kind, "reason": reason}
    )
    return value or 0.0


def test_event_the_service_breaks_on_is_bisected_out_and_later_faults_arrive(
    node_a: FixtureNode, tmp_path: Path, standin: StandInService
) -> None:
    a = AgentThread(settings_for(node_a.root, tmp_path, standin.url)).start()
    try:
        before = _dropped("counter", "server_error")
        good = [new_event("n0", "counter", device="mlx5_0", counter="x", delta=1) for _ in range(6)]
        bad = new_event("n0", "counter", device="mlx5_0", counter="y", delta=1)
        standin.state.crash_on.add(bad["event_id"])
        a.call(lambda: a.agent._spool_events([*good[:3], bad, *good[3:]]))
        assert standin.wait_for(lambda st: len(st.events) == 6, timeout=60)
        assert wait_until(lambda: a.agent.spool.depth() == 0, timeout=30)
        letters = a.agent.spool.dead_letters()
        assert [ev["event_id"] for ev, _ in letters] == [bad["event_id"]]
        assert "HTTP 500" in letters[0][1]
        assert _dropped("counter", "server_error") == before + 1
        # Bounded: the poisoned batch was tried a few rounds, not forever.
        posts = standin.state.posts
        assert posts < 40
        # A fault after it still arrives, and in order.
        later = new_event("n0", "port_down", device="mlx5_1", port=1)
        a.call(lambda: a.agent._spool_events([later]))
        assert standin.wait_for(lambda st: later["event_id"] in st.events, timeout=30)
        assert standin.state.event_order == [e["event_id"] for e in good] + [later["event_id"]]
    finally:
        a.stop()
