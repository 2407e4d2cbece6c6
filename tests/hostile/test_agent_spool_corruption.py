"""A bad spool row or a garbage spool file is set aside loudly; the agent runs on.

Issue 30: one unparsable spool row stopped the agent at every start (a crash loop, the
row never leaving), and a garbage spool file ended in a traceback. Here the agent starts
on each, against the real service on loopback, and a port going down still reaches it.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from agent.events import new_event
from agent.spool import FILE, Spool
from railover_testing.agents import AgentThread, settings_for
from railover_testing.local import local_service
from railover_testing.processes import store_rows
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import FixtureNode, shape_a, write_rail_map
from railover_testing.waiting import wait_until
from scheduler_svc.config import Settings


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name, {}) or 0.0


@pytest.fixture
def node(tmp_path: Path) -> FixtureNode:
    return shape_a(tmp_path / "sys")


@pytest.fixture
def service(tmp_path: Path, sqlite_migrated: Path) -> Iterator[tuple[str, str]]:
    db = tmp_path / "svc.db"
    shutil.copyfile(sqlite_migrated, db)
    url = f"sqlite:///{db}"
    with local_service(Settings(db_url=url, port=0, allow_anonymous_loopback=True)) as base:
        yield base, url


def _kinds(db_url: str) -> list[str]:
    return [str(k) for (k,) in store_rows(db_url, "SELECT kind FROM events ORDER BY rowid")]


@dataclass
class Rig:
    """A node, the service on loopback (its base URL and store), and the agent's place."""

    node: FixtureNode
    tmp_path: Path
    base: str
    db_url: str

    @property
    def spool_dir(self) -> Path:
        return self.tmp_path / "agent" / "spool"

    def run_and_fault(self) -> AgentThread:
        """Starts the agent on whatever spool is there and takes a port down: it arrives."""
        rails = write_rail_map(self.tmp_path / "rails.json", self.node.rail_map())
        a = AgentThread(settings_for(self.node.root, self.tmp_path / "agent", self.base, rails))
        a.start()
        set_port_state(self.node.root, "mlx5_0", 1, "DOWN")
        assert wait_until(lambda: "port_down" in _kinds(self.db_url), timeout=20)
        return a


@pytest.fixture
def rig(node: FixtureNode, tmp_path: Path, service: tuple[str, str]) -> Rig:
    base, db_url = service
    return Rig(node, tmp_path, base, db_url)


def test_an_unreadable_row_is_quarantined_and_the_rest_flows(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    spool_dir = rig.spool_dir
    s = Spool(spool_dir, 1000)
    good = new_event("n0", "port_up", device="mlx5_3", port=1)
    s.put([good])
    s.close()
    with sqlite3.connect(spool_dir / FILE) as db:
        # Ahead of the good row (lane 0): a body that is not JSON, one that is not UTF-8,
        # and JSON that is no event.
        for i, body in enumerate([b"{not json", b"\xff\xfe\x00", b"[1, 2]"]):
            db.execute(
                "INSERT INTO events (seq, event_id, kind, droppable, body, lane) "
                "VALUES (?, ?, 'port_down', 0, ?, 0)",
                (-10 + i, f"bad{i}", body),
            )
    before = _metric("railover_agent_spool_quarantined_total")
    with caplog.at_level(logging.ERROR, logger="agent.spool"):
        a = rig.run_and_fault()
    try:
        assert wait_until(lambda: "port_up" in _kinds(rig.db_url), timeout=10)
        assert _metric("railover_agent_spool_quarantined_total") - before == 3
        kept = a.call(a.agent.spool.quarantined)
        assert [(seq, body) for seq, body, _ in kept] == [
            (-10, b"{not json"),
            (-9, b"\xff\xfe\x00"),
            (-8, b"[1, 2]"),
        ]
        lines = [
            r.getMessage() for r in caplog.records if "quarantined spool row" in r.getMessage()
        ]
        assert len(lines) == 3
        assert all("\n" not in line for line in lines)
    finally:
        a.stop()
    # And again: the rows do not come back at the next start. Other rows may be queued by
    # then (the port is still down), so the spool is read for these rows by name, at rest.
    quarantined = _metric("railover_agent_spool_quarantined_total")
    a = AgentThread(a.settings).start()
    a.stop()
    with sqlite3.connect(spool_dir / FILE) as db:
        assert db.execute("SELECT count(*) FROM events WHERE event_id LIKE 'bad%'").fetchone() == (
            0,
        )
        assert db.execute("SELECT seq FROM quarantine ORDER BY id").fetchall() == [
            (-10,),
            (-9,),
            (-8,),
        ]
    assert _metric("railover_agent_spool_quarantined_total") == quarantined


def test_a_garbage_spool_file_is_moved_aside_and_a_fresh_one_made(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    spool_dir = rig.spool_dir
    spool_dir.mkdir(parents=True)
    garbage = b"this is not an SQLite database\n" * 200
    (spool_dir / FILE).write_bytes(garbage)
    before = _metric("railover_agent_spool_resets_total")
    with caplog.at_level(logging.ERROR, logger="agent.spool"):
        a = rig.run_and_fault()
    try:
        assert _metric("railover_agent_spool_resets_total") - before == 1
        (aside,) = spool_dir.glob(f"{FILE}.corrupt-*")
        assert aside.read_bytes() == garbage
        assert any("SPOOL FILE CORRUPT" in r.getMessage() for r in caplog.records)
    finally:
        a.stop()


def test_a_truncated_spool_file_is_moved_aside(tmp_path: Path) -> None:
    """A real spool cut short (a full disk, a bad copy): its pages no longer add up."""
    s = Spool(tmp_path, 10_000)
    s.put([new_event("n0", "cqe_error", device="mlx5_0", wc_status=12) for _ in range(2000)])
    s.close()
    for extra in tmp_path.glob(f"{FILE}-*"):
        extra.unlink()
    data = (tmp_path / FILE).read_bytes()
    (tmp_path / FILE).write_bytes(data[: len(data) // 2])
    s = Spool(tmp_path, 10_000)
    try:
        assert s.depth() == 0
        assert s.put([new_event("n0", "port_down", device="mlx5_0", port=1)]) == 1
        assert len(list(tmp_path.glob(f"{FILE}.corrupt-*"))) == 1
    finally:
        s.close()
