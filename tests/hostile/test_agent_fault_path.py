"""A port going down reaches the real service first, whatever a local process floods.

Issue 30: 150,000 progress frames delayed a real port-down by 105.8 s (progress and faults
shared one first-in-first-out path), and CQE frames that filled the spool while the service
was away had a real port_down refused ("spool full"). Here the flood and the noise pile up
while the service is away, a port then goes down, and the service comes back: the
port_down must be in the agent's first request, the flood still waiting behind it, and
nothing the noise said lost (folded, with its count). The floods are scaled down to keep
the suite quick; `python -m benchmarks.bench_agent_flood` runs the full 150,000 frames.
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent.events import LANE_STATE, lane_of
from native_plugin import wire, wire_codec
from railover_testing.agents import AgentThread, settings_for
from railover_testing.local import free_port, local_service
from railover_testing.plugin_frames import random_progress
from railover_testing.processes import store_rows
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import FixtureNode, shape_a, write_rail_map
from railover_testing.waiting import wait_until
from scheduler_svc.config import Settings

BATCH = 100  # events per request: the flood takes many requests to drain
IBV_EVENT_PORT_ERR = 10


def _metric(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def node(tmp_path: Path) -> FixtureNode:
    return shape_a(tmp_path / "sys")


@pytest.fixture
def rails(node: FixtureNode, tmp_path: Path) -> Path:
    return write_rail_map(tmp_path / "rails.json", node.rail_map())


@contextmanager
def service_on(port: int, db: Path) -> Iterator[str]:
    """The real service (in this process, over loopback HTTP) on `port`, store `db`."""
    settings = Settings(db_url=f"sqlite:///{db}", port=port, allow_anonymous_loopback=True)
    with local_service(settings) as url:
        yield url


def plugin_connection(a: AgentThread, comm_id: int, rank: int, pid: int) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(a.settings.socket))
    s.sendall(wire_codec.encode(wire.Hello(comm_id=comm_id, pid=pid, abi_version=1, rank=rank)))
    return s


def progress_flood(a: AgentThread, frames: int, connections: int) -> int:
    """`frames` progress frames of random communicators over `connections`; returns the
    frames sent (each connection as one process would send them: back to back)."""
    rng = random.Random(30)
    socks = [plugin_connection(a, 0, 0, 9000 + i) for i in range(connections)]
    now = time.time_ns()
    per = frames // connections
    for i, s in enumerate(socks):
        s.sendall(random_progress(rng, per, 9000 + i, ranks=8, now_ns=now))
    for s in socks:
        s.close()
    return per * connections


def agent_for_a_service(
    node: FixtureNode, rails: Path, tmp_path: Path, sqlite_migrated: Path, **settings: Any
) -> tuple[Path, int, AgentThread]:
    """A migrated SQLite store for a service on a free port, and a started agent that
    sends there (batches of BATCH, with `settings` besides): the store, port and agent."""
    db = tmp_path / "svc.db"
    shutil.copyfile(sqlite_migrated, db)
    port = free_port()
    a = AgentThread(
        settings_for(
            node.root,
            tmp_path / "agent",
            f"http://127.0.0.1:{port}",
            rails,
            batch_max=BATCH,
            **settings,
        )
    ).start()
    return db, port, a


def stored(db: Path) -> list[tuple[str, dict[str, Any]]]:
    rows = store_rows(f"sqlite:///{db}", "SELECT kind, payload FROM events ORDER BY rowid")
    return [(str(k), json.loads(p) if isinstance(p, str) else dict(p)) for k, p in rows]


def test_a_port_down_overtakes_a_progress_flood(
    node: FixtureNode, rails: Path, tmp_path: Path, sqlite_migrated: Path
) -> None:
    db, port, a = agent_for_a_service(node, rails, tmp_path, sqlite_migrated)
    try:
        # The service is away: the flood piles up in the spool, newest count per
        # communicator and poll (the hub tracks at most 256 a connection).
        sent = progress_flood(a, 20_000, connections=8)
        assert wait_until(lambda: a.agent.spool.depth() >= 2000, timeout=20)
        # A real fault, from sysfs and from a CCL on its own connection, behind the flood.
        s = plugin_connection(a, 123, 3, 4242)
        s.sendall(
            wire_codec.encode(
                wire.PortEvent(
                    timestamp_ns=time.time_ns(),
                    port=1,
                    ibv_event_type=IBV_EVENT_PORT_ERR,
                    pid=4242,
                    dev_name="mlx5_1",
                )
            )
        )
        set_port_state(node.root, "mlx5_0", 1, "DOWN")
        assert wait_until(
            lambda: (
                {"port_down", "port_event"}
                <= {ev["kind"] for _, ev in a.call(lambda: a.agent.spool.peek(BATCH))}
            ),
            timeout=10,
        )
        waiting = a.agent.spool.depth()
        with service_on(port, db):
            assert wait_until(lambda: any(k == "port_down" for k, _ in stored(db)), timeout=30), (
                "the port_down never reached the service"
            )
            got = stored(db)
            # Both faults were in the first request; the flood was still waiting behind.
            first = [k for k, _ in got[:BATCH]]
            assert "port_down" in first and "port_event" in first
            assert sum(k == "progress" for k, _ in got) < waiting
            s.close()
            a.stop()  # the rest of the flood stays in the spool
            # And the port_down became a fault.
            faults = store_rows(f"sqlite:///{db}", "SELECT device FROM faults")
            assert ("mlx5_0",) in faults
    finally:
        a.stop()
    assert sent == 20_000


def test_a_spool_full_of_cqe_noise_keeps_the_port_down_and_every_count(
    node: FixtureNode, rails: Path, tmp_path: Path, sqlite_migrated: Path
) -> None:
    db, port, a = agent_for_a_service(node, rails, tmp_path, sqlite_migrated, spool_max_events=200)
    refused_before = _metric(
        "railover_agent_events_dropped_total", {"kind": "port_down", "reason": "spool_full"}
    )
    try:
        # While the service is away, one rank's NIC throws 2,000 CQE errors: the spool fills.
        s = plugin_connection(a, 123, 3, 4242)
        noise = 2_000
        now = time.time_ns()
        s.sendall(
            b"".join(
                wire_codec.encode(
                    wire.CqeError(
                        timestamp_ns=now + q,
                        port=1,
                        qp_num=q,
                        wc_status=12,
                        vendor_err=0x81,
                        pid=4242,
                        dev_name="mlx5_2",
                        peer="10.0.0.9",
                    )
                )
                for q in range(noise)
            )
        )
        assert wait_until(
            lambda: (
                _metric("railover_agent_events_spooled_total", {"kind": "cqe_error"}) > 0
                and a.agent.spool.depth() >= 1
            ),
            timeout=10,
        )
        assert wait_until(lambda: _cqe_count(a) == noise, timeout=20), _cqe_count(a)
        set_port_state(node.root, "mlx5_0", 1, "DOWN")
        assert wait_until(
            lambda: any(
                ev["kind"] == "port_down" for _, ev in a.call(lambda: a.agent.spool.peek(500))
            ),
            timeout=10,
        ), "a spool full of CQE noise refused the port_down"
        assert a.agent.spool.depth() <= 200
        with service_on(port, db):
            assert wait_until(lambda: any(k == "port_down" for k, _ in stored(db)), timeout=30)
            assert stored(db)[0][0] == "port_down"  # first, ahead of all the noise
            # Every CQE error is accounted for: the rows folded say how many they stand for.
            assert wait_until(
                lambda: (
                    sum(
                        int(p.get("detail", {}).get("coalesced", 1))
                        for k, p in stored(db)
                        if k == "cqe_error"
                    )
                    == noise
                ),
                timeout=30,
            )
        s.close()
    finally:
        a.stop()
    assert (
        _metric(
            "railover_agent_events_dropped_total", {"kind": "port_down", "reason": "spool_full"}
        )
        == refused_before
    )


def _cqe_count(a: AgentThread) -> int:
    """CQE errors the spool stands for (a folded row counts what it holds)."""
    rows = a.call(lambda: a.agent.spool.peek(10**6))
    return sum(
        int(ev.get("detail", {}).get("coalesced", 1)) for _, ev in rows if ev["kind"] == "cqe_error"
    )


def test_state_events_lead_every_request() -> None:
    """The lanes the spool sends in: port and device state ahead of everything else."""
    for kind in ("port_down", "port_up", "port_event", "device_fatal"):
        assert lane_of(kind) == LANE_STATE
    assert lane_of("cqe_error") > LANE_STATE
    assert lane_of("progress") > lane_of("cqe_error")
