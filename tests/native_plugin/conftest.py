"""Fixtures for the native plugin tests: the built library and a stand-in agent."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from native_plugin.binding import DEFAULT_LIBRARY, library_path
from native_plugin.testing import FakeAgent

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "native_plugin"


@pytest.fixture(scope="session")
def plugin_lib() -> Path:
    """The library under test; built on first use when it is the default build output."""
    path = library_path()
    if not path.is_file() and path == DEFAULT_LIBRARY:
        if shutil.which("make") is None or shutil.which("cc") is None:
            pytest.skip("librailover_plugin.so is not built and there is no C toolchain")
        subprocess.run(["make", "-s", "-C", str(PLUGIN_DIR)], check=True)
    return path


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
