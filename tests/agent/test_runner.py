"""The agent's runner called step by step (no loops), on the second shape.

Collector rounds, registration and sends are driven one call at a time against
the loopback stand-in service, so each step's effect is checked on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from agent.collectors.base import Collected
from agent.events import new_event
from agent.runner import Agent
from agent.topology import Topology
from railover_testing.agents import StandInService, settings_for
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import FixtureNode, shape_c, write_rail_map


@pytest.fixture
def node_c(tmp_path: Path) -> FixtureNode:
    return shape_c(tmp_path / "sys")


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One loop per test: the agent's HTTP client belongs to the loop it first ran on."""
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture
def agent(
    node_c: FixtureNode, tmp_path: Path, standin: StandInService, loop: asyncio.AbstractEventLoop
) -> Iterator[Agent]:
    rail_map = write_rail_map(tmp_path / "rails.json", node_c.rail_map())
    a = Agent(settings_for(node_c.root, tmp_path / "agent", standin.url, rail_map))
    yield a
    a.supervisor.close()
    loop.run_until_complete(a.client.aclose())
    a.spool.close()


def poll(agent: Agent, loop: asyncio.AbstractEventLoop) -> None:
    """One round of every collector (topology first, as at start), then the agent's tick."""
    loop.run_until_complete(agent.supervisor.first_round())
    loop.run_until_complete(agent._poll_once())


def registrations() -> float:
    return REGISTRY.get_sample_value("railover_agent_registrations_total") or 0.0


def success(name: str) -> float | None:
    return REGISTRY.get_sample_value("railover_agent_collector_success", {"collector": name})


def test_first_poll_is_a_baseline_and_a_flip_is_an_event(
    agent: Agent, node_c: FixtureNode, loop: asyncio.AbstractEventLoop
) -> None:
    assert agent.health()[0] is False  # never polled
    poll(agent, loop)
    assert agent.spool.depth() == 0  # nothing happened yet: state only
    assert agent.spool.get_state("ports") is not None
    assert agent.supervisor.topology is not None
    assert len(agent.supervisor.topology.rnics) == 10
    ok, detail = agent.health()
    assert ok and detail["spool_events"] == 0 and detail["registered"] is False
    set_port_state(node_c.root, "mlx5_2", 2, "DOWN")
    poll(agent, loop)
    ((_, ev),) = agent.spool.peek(10)
    assert (ev["kind"], ev["device"], ev["port"]) == ("port_down", "mlx5_2", 2)
    assert agent._wake.is_set()  # the report loop is told at once


def test_a_failing_collector_does_not_stop_the_others(
    agent: Agent,
    node_c: FixtureNode,
    monkeypatch: pytest.MonkeyPatch,
    loop: asyncio.AbstractEventLoop,
) -> None:
    (counters,) = [c for c in agent.collectors if c.name == "counters"]

    def broken(topology: Topology | None) -> Collected:
        raise OSError("sysfs read failed")

    monkeypatch.setattr(counters, "collect", broken)
    poll(agent, loop)
    set_port_state(node_c.root, "mlx5_0", 1, "DOWN")
    poll(agent, loop)
    assert success("counters") == 0.0
    assert success("ports") == 1.0
    assert [e["kind"] for _, e in agent.spool.peek(10)] == ["port_down"]


def test_registration_happens_once_per_topology(
    agent: Agent, standin: StandInService, loop: asyncio.AbstractEventLoop
) -> None:
    poll(agent, loop)
    before = registrations()
    assert loop.run_until_complete(agent._register_if_needed()) is True
    assert registrations() == before + 1
    assert agent.supervisor.topology is not None
    assert agent.registered == agent.supervisor.topology.fingerprint()
    body = standin.state.nodes["n0"]
    assert [(r["name"], r["port"]) for r in body["rnics"][:2]] == [("mlx5_0", 1), ("mlx5_0", 2)]
    assert all(isinstance(g["nvlink"], bool) for g in body["gpus"])
    loop.run_until_complete(agent._register_if_needed())  # the same topology: nothing sent
    assert registrations() == before + 1


def test_send_removes_what_the_service_took_and_sets_aside_what_it_refused(
    agent: Agent, standin: StandInService, loop: asyncio.AbstractEventLoop
) -> None:
    good = [new_event("n0", "port_down", device="mlx5_0", port=1) for _ in range(3)]
    bad = new_event("n0", "port_down", device="mlx5_1", port=1)
    standin.state.poison.add(bad["event_id"])
    agent.spool.put([*good[:2], bad, good[2]])
    loop.run_until_complete(agent._send(agent.spool.peek(10)))
    assert agent.spool.depth() == 0
    assert [e["event_id"] for e, _ in agent.spool.dead_letters()] == [bad["event_id"]]
    assert standin.state.event_order == [e["event_id"] for e in good]
