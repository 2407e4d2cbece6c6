"""Fixtures for the native plugin tests: socket paths and a stand-in agent (the library's
fixture, `plugin_lib`, is in tests/conftest.py)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from railover_testing.fake_agent import FakeAgent
from tests.deploy.tools import need_tool


@pytest.fixture(scope="session")
def cc() -> str:
    """The C compiler the agreement tests build with (a failure under `make test`)."""
    return need_tool("cc")


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for unix sockets (sun_path holds 107 bytes; tmp_path can be longer)."""
    d = Path(tempfile.mkdtemp(prefix="rv-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def agent_path(sock_dir: Path) -> Path:
    return sock_dir / "agent.sock"


@pytest.fixture
def agent(agent_path: Path) -> Iterator[FakeAgent]:
    fake = FakeAgent(agent_path)
    yield fake
    fake.close()
