"""What one local process can do to the agent's plugin socket, and the bound on each.

Issue 30: 512 idle connections took every plugin slot; a partial frame was never timed
out; a device name with a newline wrote forged lines into the agent log; 3,000 bogus ACK
frames delayed a real abort's ack by 31.5 s; PluginHub.last_ops grew with every random
communicator id (RSS 57 -> 193 MB). Each attack here runs against a real agent over its
unix socket, frames made by native_plugin/wire_codec.py, and a stand-in service on
loopback that records what the agent sent.
"""

from __future__ import annotations

import logging
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from native_plugin import wire, wire_codec
from railover_testing.agents import AgentThread, StandInService, settings_for
from railover_testing.plugin_frames import random_progress
from railover_testing.sysfs_node import shape_a, write_rail_map
from railover_testing.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
IBV_EVENT_PORT_ERR = 10


def _metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def _refused(reason: str) -> float:
    return _metric("railover_agent_plugin_connections_refused_total", {"reason": reason})


@pytest.fixture
def standin() -> Iterator[StandInService]:
    svc = StandInService()
    yield svc
    svc.stop()


def _agent(tmp_path: Path, standin: StandInService, **overrides: Any) -> AgentThread:
    node = shape_a(tmp_path / "sys")
    rails = write_rail_map(tmp_path / "rails.json", node.rail_map())
    return AgentThread(settings_for(node.root, tmp_path / "agent", standin.url, rails, **overrides))


@pytest.fixture
def agent(tmp_path: Path, standin: StandInService) -> Iterator[AgentThread]:
    a = _agent(tmp_path, standin).start()
    yield a
    a.stop()


def connect(a: AgentThread) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(a.settings.socket))
    return s


def hello(s: socket.socket, comm_id: int = 123, rank: int = 3, pid: int = 4242) -> None:
    s.sendall(wire_codec.encode(wire.Hello(comm_id=comm_id, pid=pid, abi_version=1, rank=rank)))


def closed_by_agent(s: socket.socket, timeout: float = 10.0) -> bool:
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def port_err(dev: str = "mlx5_1") -> bytes:
    return wire_codec.encode(
        wire.PortEvent(
            timestamp_ns=time.time_ns(),
            port=1,
            ibv_event_type=IBV_EVENT_PORT_ERR,
            pid=4242,
            dev_name=dev,
        )
    )


def reported(standin: StandInService, kind: str) -> list[dict[str, Any]]:
    with standin.state.lock:
        return [e for e in standin.state.events.values() if e["kind"] == kind]


def test_connections_that_never_say_hello_are_closed(
    tmp_path: Path, standin: StandInService
) -> None:
    a = _agent(tmp_path, standin, plugin_hello_timeout_s=0.3, plugin_max_clients=16).start()
    try:
        before = _refused("hello")
        idle = [connect(a) for _ in range(16)]  # every slot
        assert all(closed_by_agent(s) for s in idle)
        assert _refused("hello") - before == 16
        # The slots are free again: a CCL connects and reports its port fault.
        s = connect(a)
        hello(s)
        s.sendall(port_err())
        assert standin.wait_for(
            lambda st: any(e["kind"] == "port_event" for e in st.events.values())
        )
        s.close()
        for s in idle:
            s.close()
    finally:
        a.stop()


def test_one_process_cannot_take_every_slot(tmp_path: Path, standin: StandInService) -> None:
    a = _agent(tmp_path, standin, plugin_max_clients_per_process=8).start()
    try:
        before = _refused("process_slots")
        held = [connect(a) for _ in range(8)]
        for s in held:
            hello(s)
        extra = connect(a)
        assert closed_by_agent(extra)
        assert _refused("process_slots") - before == 1
        # Another process (a real CCL's) still gets in, and its fault goes through.
        code = (
            "import socket, sys, time\n"
            "from native_plugin import wire, wire_codec\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "s.connect(sys.argv[1])\n"
            "s.sendall(wire_codec.encode(wire.Hello(comm_id=5, pid=1, abi_version=1, rank=0)))\n"
            "s.sendall(wire_codec.encode(wire.PortEvent(timestamp_ns=time.time_ns(), port=1,"
            " ibv_event_type=10, pid=1, dev_name='mlx5_2')))\n"
            "s.shutdown(socket.SHUT_WR)\n"
            "s.recv(1)\n"
        )
        subprocess.run(
            [sys.executable, "-c", code, str(a.settings.socket)], cwd=REPO, check=True, timeout=60
        )
        assert standin.wait_for(
            lambda st: any(e.get("device") == "mlx5_2" for e in st.events.values())
        )
        for s in [*held, extra]:
            s.close()
    finally:
        a.stop()


def test_a_frame_left_half_sent_is_timed_out_even_while_trickling(
    tmp_path: Path, standin: StandInService
) -> None:
    a = _agent(tmp_path, standin, plugin_frame_timeout_s=0.5).start()
    try:
        before = _refused("partial_frame")
        s = connect(a)
        hello(s)
        frame = port_err()
        s.sendall(frame[:3])
        started = time.monotonic()
        # One byte every 0.1 s keeps the connection busy but never finishes the frame.
        s.settimeout(0.1)
        closed = False
        for b in frame[3:-1]:
            try:
                s.sendall(bytes([b]))
                if s.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
        assert closed or closed_by_agent(s)
        assert time.monotonic() - started < 5
        assert _refused("partial_frame") - before == 1
        assert not reported(standin, "port_event")
        s.close()
    finally:
        a.stop()


def test_a_device_name_cannot_forge_a_log_line(
    agent: AgentThread, standin: StandInService, caplog: pytest.LogCaptureFixture
) -> None:
    forged = "mlx5_0\n2026-12-06 INFO agent: all ports healthy"
    malformed = _metric("railover_agent_plugin_malformed_frames_total")
    with caplog.at_level(logging.DEBUG, logger="agent"):
        s = connect(agent)
        hello(s)
        s.sendall(
            wire_codec.encode(
                wire.CqeError(
                    timestamp_ns=time.time_ns(),
                    port=1,
                    qp_num=7,
                    wc_status=12,
                    vendor_err=0,
                    pid=4242,
                    dev_name=forged,
                    peer="10.0.0.9",
                )
            )
        )
        assert closed_by_agent(s)
        s.close()
    assert _metric("railover_agent_plugin_malformed_frames_total") - malformed == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any("mlx5_0\\n2026-12-06" in m for m in messages), messages
    assert not any("\n" in m for m in messages)
    assert not reported(standin, "cqe_error")


def _abort(cid: int) -> dict[str, Any]:
    return {
        "command_id": cid, "job_id": "j1", "kind": "abort", "epoch": 1, "comm_id": 123,
        "ops_done": 0, "disabled_channels": [], "ranks": [3],
    }  # fmt: skip


def test_bogus_acks_neither_reach_the_service_nor_delay_a_real_one(
    agent: AgentThread, standin: StandInService
) -> None:
    hub = agent.agent.hub
    assert hub is not None
    rank3 = connect(agent)
    hello(rank3)
    assert wait_until(lambda: sum(c.hello for c in hub.clients) == 1)
    standin.add_command(_abort(77))
    rank3.settimeout(10)
    assert len(wire_codec.FrameDecoder().feed(rank3.recv(4096))) == 1
    assert standin.wait_for(lambda st: any(c == 77 for c, _ in st.acks))
    posts = standin.state.ack_posts
    # 3,000 acks for commands never handed out, and 3,000 answers of the real one from a
    # process it was not for (another rank), and repeats of the real rank's answer.
    attacker = connect(agent)
    hello(attacker, rank=5, pid=666)
    rng = random.Random(30)
    attacker.sendall(
        b"".join(
            wire_codec.encode(wire.Ack(command_id=rng.randrange(1000, 10**9), status=0, pid=666))
            for _ in range(3000)
        )
        + b"".join(
            wire_codec.encode(wire.Ack(command_id=77, status=0, pid=666)) for _ in range(3000)
        )
    )
    refused = "railover_agent_plugin_acks_refused_total"
    assert wait_until(lambda: _metric(refused, {"reason": "not_addressed"}) >= 3000, timeout=20)
    rank3.sendall(wire_codec.encode(wire.Ack(command_id=77, status=0, pid=4242)) * 50)
    assert standin.wait_for(
        lambda st: any(c == 77 and b["status"] == "applied" for c, b in st.acks), timeout=10
    )
    assert wait_until(lambda: hub.acks.qsize() == 0)
    applied = [b for c, b in standin.state.acks if b["status"] == "applied"]
    assert len(applied) == 1 and applied[0]["rank"] == 3
    assert {c for c, _ in standin.state.acks} == {77}
    assert standin.state.ack_posts - posts == 1
    # Unknown ones wait for their command, bounded; none of them was ever sent.
    assert len(hub.held_acks) <= hub.max_held_acks
    for s in (attacker, rank3):
        s.close()


def test_an_ack_before_its_command_waits_for_it(
    agent: AgentThread, standin: StandInService
) -> None:
    """After an agent restart a rank may answer before the service re-sends the command."""
    hub = agent.agent.hub
    assert hub is not None
    s = connect(agent)
    hello(s)
    assert wait_until(lambda: sum(c.hello for c in hub.clients) == 1)
    s.sendall(wire_codec.encode(wire.AckAt(command_id=88, status=0, pid=4242, ops_done=10)))
    assert wait_until(lambda: len(hub.held_acks) == 1)
    standin.add_command(_abort(88))
    assert standin.wait_for(
        lambda st: any(c == 88 and b["status"] == "applied" for c, b in st.acks), timeout=10
    )
    s.close()


def test_communicators_are_bounded_and_forgotten_with_their_connections(
    agent: AgentThread,
) -> None:
    hub = agent.agent.hub
    assert hub is not None
    limit = agent.settings.plugin_max_communicators_per_client
    dropped = _metric("railover_agent_plugin_progress_dropped_total", {"reason": "client_limit"})
    rng = random.Random(30)
    socks = [connect(agent) for _ in range(3)]
    for i, s in enumerate(socks):
        hello(s, comm_id=0, rank=0, pid=500 + i)
        s.sendall(random_progress(rng, limit + 100, 500 + i))
    assert wait_until(lambda: len(hub.last_ops) == 3 * limit, timeout=10), len(hub.last_ops)
    assert wait_until(
        lambda: (
            _metric("railover_agent_plugin_progress_dropped_total", {"reason": "client_limit"})
            - dropped
            == 300
        )
    )
    socks[0].close()
    socks[1].close()
    assert wait_until(lambda: len(hub.last_ops) == limit)
    socks[2].close()
    assert wait_until(lambda: not hub.last_ops and all(not c.keys for c in hub.clients))
