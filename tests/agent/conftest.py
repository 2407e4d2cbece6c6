from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Helpers (agent_standin, agent_harness) live beside the tests; pytest's
# importlib mode does not put this directory on sys.path by itself.
sys.path.insert(0, str(Path(__file__).parent))

from railover_testing.agents import AgentThread, StandInService, settings_for
from railover_testing.sysfs_node import FixtureNode, shape_a, shape_b, write_rail_map


@pytest.fixture
def node_a(tmp_path: Path) -> FixtureNode:
    return shape_a(tmp_path / "sys")


@pytest.fixture
def node_b(tmp_path: Path) -> FixtureNode:
    return shape_b(tmp_path / "sys")


@pytest.fixture
def rail_map_a(node_a: FixtureNode, tmp_path: Path) -> Path:
    return write_rail_map(tmp_path / "rails.json", node_a.rail_map())


@pytest.fixture
def standin() -> Iterator[StandInService]:
    svc = StandInService()
    yield svc
    svc.stop()


@pytest.fixture
def running(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, standin: StandInService
) -> Iterator[AgentThread]:
    """An agent on node A, its plugin socket listening (the test_agent_plugin*.py tests)."""
    a = AgentThread(settings_for(node_a.root, tmp_path, standin.url, rail_map_a)).start()
    yield a
    a.stop()
