"""The plugin socket: real unix sockets, frames from native_plugin.wire."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from agent.plugin import to_wire_command
from native_plugin import wire, wire_codec
from railover_testing.agents import AgentThread, StandInService, settings_for
from railover_testing.sysfs_node import FixtureNode
from railover_testing.waiting import wait_until


def _metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


@pytest.fixture
def running(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, standin: StandInService
) -> Iterator[AgentThread]:
    a = AgentThread(settings_for(node_a.root, tmp_path, standin.url, rail_map_a)).start()
    yield a
    a.stop()


def _connect(a: AgentThread) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(a.settings.socket))
    return s


def _recv_messages(s: socket.socket, n: int, timeout: float = 5.0) -> list[wire.Message]:
    dec = wire_codec.FrameDecoder()
    out: list[wire.Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        data = s.recv(4096)
        if not data:
            break
        out.extend(dec.feed(data))
    return out


def _is_closed(s: socket.socket) -> bool:
    s.settimeout(5)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_plugin_events_reach_the_service(running: AgentThread, standin: StandInService) -> None:
    s = _connect(running)
    now_ns = time.time_ns()
    frames: list[wire.Message] = [
        wire.Hello(comm_id=77, pid=1234, abi_version=1, rank=3),
        wire.CqeError(
            timestamp_ns=now_ns,
            port=1,
            qp_num=0x1A2,
            wc_status=12,
            vendor_err=0x81,
            pid=1234,
            dev_name="mlx5_0",
            peer="10.0.0.2",
        ),
        wire.PortEvent(timestamp_ns=now_ns, port=1, ibv_event_type=10, pid=1234, dev_name="mlx5_1"),
        wire.PortEvent(timestamp_ns=now_ns, port=0, ibv_event_type=8, pid=1234, dev_name="mlx5_2"),
        wire.PathSwitch(
            comm_id=77,
            timestamp_ns=now_ns,
            channel=2,
            reason=1,
            pid=1234,
            from_dev="mlx5_0",
            to_dev="mlx5_1",
        ),
    ]
    # Many progress samples: only the newest per (comm, rank) is sent.
    frames += [
        wire.Progress(comm_id=77, ops_done=i, timestamp_ns=now_ns, rank=3, pid=1234)
        for i in range(1, 501)
    ]
    # Split frames across writes at odd places, as a stream socket may.
    data = b"".join(wire_codec.encode(f) for f in frames)
    for i in range(0, len(data), 37):
        s.sendall(data[i : i + 37])
    # Every kind, and the last progress sample (the agent sends the latest per rank; an
    # earlier one may arrive first under load).
    assert standin.wait_for(
        lambda st: (
            {e["kind"] for e in st.events.values()}
            >= {"cqe_error", "port_event", "device_fatal", "path_switch"}
            and any(e["kind"] == "progress" and e["ops_done"] == 500 for e in st.events.values())
        )
    )
    evs = {e["kind"]: e for e in standin.state.events.values()}
    cqe = evs["cqe_error"]
    assert (cqe["device"], cqe["port"], cqe["wc_status"], cqe["vendor_err"]) == (
        "mlx5_0",
        1,
        12,
        0x81,
    )
    assert (cqe["comm_id"], cqe["rank"]) == (77, 3)
    assert cqe["detail"]["qp_num"] == 0x1A2 and cqe["detail"]["peer"] == "10.0.0.2"
    assert evs["port_event"]["event_type"] == 10
    assert evs["device_fatal"]["device"] == "mlx5_2" and "port" not in evs["device_fatal"]
    ps = evs["path_switch"]
    assert ps["detail"]["reason"] == "failover" and ps["detail"]["to_dev"] == "mlx5_1"
    progress = [e for e in standin.state.events.values() if e["kind"] == "progress"]
    assert progress[-1]["ops_done"] == 500
    assert len(progress) < 50
    s.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00" * 16,  # bad magic
        struct.pack("<IHHII", wire.MAGIC, wire.VERSION, int(wire.MsgType.PROGRESS), 10**6, 0),
        struct.pack("<IHHII", wire.MAGIC, 99, int(wire.MsgType.PROGRESS), 32, 0),
        struct.pack("<IHHII", wire.MAGIC, wire.VERSION, 250, 8, 0) + b"\x00" * 8,
    ],
    ids=["bad-magic", "oversized", "bad-version", "unknown-type"],
)
def test_malformed_frames_drop_the_connection_only(
    running: AgentThread, standin: StandInService, garbage: bytes
) -> None:
    before = _metric("railover_agent_plugin_malformed_frames_total")
    bad = _connect(running)
    good = _connect(running)
    good.sendall(wire_codec.encode(wire.Hello(comm_id=5, pid=2, abi_version=1, rank=0)))
    # A valid frame before the garbage is still acted on.
    ok = wire.CqeError(
        timestamp_ns=0,
        port=1,
        qp_num=1,
        wc_status=5,
        vendor_err=0,
        pid=1,
        dev_name="mlx5_3",
        peer="",
    )
    bad.sendall(wire_codec.encode(ok) + garbage)
    assert _is_closed(bad)
    assert wait_until(lambda: _metric("railover_agent_plugin_malformed_frames_total") == before + 1)
    assert standin.wait_for(lambda st: any(e.get("device") == "mlx5_3" for e in st.events.values()))
    # The other client and the listener carry on.
    good.sendall(
        wire_codec.encode(
            wire.CqeError(
                timestamp_ns=0,
                port=1,
                qp_num=1,
                wc_status=12,
                vendor_err=0,
                pid=2,
                dev_name="mlx5_4",
                peer="",
            )
        )
    )
    assert standin.wait_for(lambda st: any(e.get("device") == "mlx5_4" for e in st.events.values()))
    third = _connect(running)
    third.close()
    good.close()


def test_client_sending_a_command_is_dropped(running: AgentThread) -> None:
    s = _connect(running)
    cmd = wire.Command(command_id=1, comm_id=1, ops_done=0, disabled_channels=0, kind=1, epoch=1)
    s.sendall(wire_codec.encode(cmd))
    assert _is_closed(s)


def test_commands_are_relayed_and_acked(running: AgentThread, standin: StandInService) -> None:
    mine = _connect(running)
    other = _connect(running)
    mine.sendall(wire_codec.encode(wire.Hello(comm_id=123, pid=10, abi_version=1, rank=3)))
    other.sendall(wire_codec.encode(wire.Hello(comm_id=999, pid=11, abi_version=1, rank=0)))
    assert wait_until(
        lambda: (
            running.agent.hub is not None and sum(c.hello for c in running.agent.hub.clients) == 2
        )
    )
    standin.add_command(
        {
            "command_id": 17,
            "job_id": "j1",
            "kind": "rebalance",
            "epoch": 2,
            "comm_id": 123,
            "ops_done": 5000,
            "disabled_channels": [2, 3],
            "ranks": [],
        }
    )
    (msg,) = _recv_messages(mine, 1)
    assert msg == wire.Command(
        command_id=17, comm_id=123, ops_done=5000, disabled_channels=0b1100, kind=1, epoch=2
    )
    assert standin.wait_for(lambda st: any(b["status"] == "delivered" for _, b in st.acks))
    # Forwarded before "delivered" was acked: had the other communicator's client been sent
    # anything, it would be waiting in its socket now.
    other.setblocking(False)
    with pytest.raises(BlockingIOError):
        other.recv(1)
    other.setblocking(True)
    mine.sendall(wire_codec.encode(wire.Ack(command_id=17, status=0, pid=10)))
    assert standin.wait_for(lambda st: any(b["status"] == "applied" for _, b in st.acks))
    applied = [b for cid, b in standin.state.acks if b["status"] == "applied"]
    assert applied == [{"node": "n0", "rank": 3, "status": "applied", "detail": "(pid 10)"}]
    mine.sendall(wire_codec.encode(wire.Ack(command_id=17, status=-3, pid=10)))
    assert standin.wait_for(lambda st: any(b["status"] == "too_late" for _, b in st.acks))
    (late,) = [b for _, b in standin.state.acks if b["status"] == "too_late"]
    assert late["rank"] == 3
    mine.close()
    other.close()


def _ranks_of(body: dict[str, object]) -> list[object]:
    ranks = body.get("ranks")
    return list(ranks) if isinstance(ranks, list) else [body.get("rank")]


def test_a_nodes_rank_acks_go_out_together(running: AgentThread, standin: StandInService) -> None:
    """Eight ranks applying one switch point: the acks that queue while one is on its way
    go out as one request, and every rank is acknowledged exactly once."""
    ranks = list(range(8))
    socks = [_connect(running) for _ in ranks]
    for r, s in zip(ranks, socks, strict=True):
        s.sendall(wire_codec.encode(wire.Hello(comm_id=123, pid=100 + r, abi_version=1, rank=r)))
    hub = running.agent.hub
    assert hub is not None
    assert wait_until(lambda: sum(c.hello for c in hub.clients) == len(ranks))
    standin.add_command(
        {
            "command_id": 21,
            "job_id": "j1",
            "kind": "rebalance",
            "epoch": 1,
            "comm_id": 123,
            "ops_done": 900,
            "disabled_channels": [1],
            "ranks": ranks,
        }
    )
    for s in socks:
        assert len(_recv_messages(s, 1)) == 1
    assert standin.wait_for(lambda st: any(b["status"] == "delivered" for _, b in st.acks))
    # The service is slow: the first ack waits at its door while the other seven arrive.
    gate = threading.Event()
    standin.state.ack_gate = gate
    posts = standin.state.ack_posts
    socks[0].sendall(wire_codec.encode(wire.AckAt(command_id=21, status=0, pid=100, ops_done=900)))
    assert standin.wait_for(lambda st: st.ack_posts == posts + 1)
    for r, s in zip(ranks[1:], socks[1:], strict=True):
        s.sendall(wire_codec.encode(wire.AckAt(command_id=21, status=0, pid=100 + r, ops_done=900)))
    assert wait_until(lambda: hub.acks.qsize() == len(ranks) - 1)
    standin.state.ack_gate = None
    gate.set()
    assert standin.wait_for(lambda st: st.ack_posts == posts + 2)
    assert standin.wait_for(lambda st: sum(b["status"] == "applied" for _, b in st.acks) == 2)
    applied = [b for cid, b in standin.state.acks if cid == 21 and b["status"] == "applied"]
    assert [_ranks_of(b) for b in applied] == [[0], ranks[1:]]
    assert {b["ops_done"] for b in applied} == {900}
    assert str(applied[1]["detail"]).startswith("7 ranks: at ops_done 900 (pid 101); at ops_done")
    for s in socks:
        s.close()


def test_acks_that_fail_are_sent_again_in_their_order(
    running: AgentThread, standin: StandInService
) -> None:
    s = _connect(running)
    s.sendall(wire_codec.encode(wire.Hello(comm_id=123, pid=10, abi_version=1, rank=3)))
    hub = running.agent.hub
    assert hub is not None
    assert wait_until(lambda: sum(c.hello for c in hub.clients) == 1)
    for cid in (31, 32):
        standin.add_command(
            {
                "command_id": cid,
                "job_id": "j1",
                "kind": "failover",
                "epoch": 0,
                "comm_id": 123,
                "ops_done": 0,
                "disabled_channels": [],
                "ranks": [3],
            }
        )
    assert len(_recv_messages(s, 2)) == 2
    assert standin.wait_for(
        lambda st: {c for c, b in st.acks if b["status"] == "delivered"} == {31, 32}
    )
    # Every try of the client's three fails: the loop backs off and sends both again.
    standin.state.fail_acks = 3
    posts = standin.state.ack_posts
    s.sendall(wire_codec.encode(wire.Ack(command_id=31, status=0, pid=10)))
    s.sendall(wire_codec.encode(wire.Ack(command_id=32, status=0, pid=10)))
    assert standin.wait_for(lambda st: sum(b["status"] == "applied" for _, b in st.acks) == 2)
    applied = [(cid, b["rank"]) for cid, b in standin.state.acks if b["status"] == "applied"]
    assert applied == [(31, 3), (32, 3)]
    assert standin.state.ack_posts >= posts + 3 + 2
    s.close()


def commands_received() -> float:
    return REGISTRY.get_sample_value("railover_agent_commands_received_total") or 0.0


def test_command_waits_for_a_client_then_fails(
    running: AgentThread, standin: StandInService
) -> None:
    received = commands_received()
    standin.add_command(
        {
            "command_id": 5,
            "job_id": "j",
            "kind": "abort",
            "epoch": 1,
            "comm_id": 42,
            "ops_done": 0,
            "disabled_channels": [],
            "ranks": [],
        }
    )
    standin.add_command(
        {
            "command_id": 6,
            "job_id": "j",
            "kind": "abort",
            "epoch": 1,
            "comm_id": 43,
            "ops_done": 0,
            "disabled_channels": [],
            "ranks": [],
        }
    )
    # Both fetched from the service (and held by the agent) before the late client connects.
    assert wait_until(lambda: commands_received() >= received + 2, timeout=30)
    late = _connect(running)
    late.sendall(wire_codec.encode(wire.Hello(comm_id=42, pid=9, abi_version=1, rank=1)))
    (msg,) = _recv_messages(late, 1)
    assert (
        isinstance(msg, wire.Command) and msg.command_id == 5 and msg.kind == wire.CommandKind.ABORT
    )
    # Nobody for comm 43 within COMMAND_HOLD_S (2 s in tests): acked failed, not lost.
    assert standin.wait_for(
        lambda st: any(cid == 6 and b["status"] == "failed" for cid, b in st.acks), timeout=6
    )
    late.close()


def test_stale_socket_is_replaced_but_a_live_one_is_not(
    node_a: FixtureNode, tmp_path: Path, standin: StandInService
) -> None:
    s1 = settings_for(node_a.root, tmp_path / "a", standin.url)
    a = AgentThread(s1).start()
    try:
        s2 = settings_for(node_a.root, tmp_path / "b", standin.url, socket=s1.socket)
        with pytest.raises(RuntimeError, match="another agent is listening"):
            AgentThread(s2).start()
    finally:
        a.stop()
    # Simulate a crashed agent: a socket file with nobody behind it.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(s1.socket))
    dead.close()
    a = AgentThread(
        settings_for(node_a.root, tmp_path / "c", standin.url, socket=s1.socket)
    ).start()
    try:
        _connect(a).close()
    finally:
        a.stop()


def test_balance_goes_with_its_weights_to_abi2_and_as_a_rebalance_to_abi1(
    running: AgentThread, standin: StandInService
) -> None:
    new = _connect(running)
    old = _connect(running)
    new.sendall(wire_codec.encode(wire.Hello(comm_id=123, pid=10, abi_version=2, rank=0)))
    old.sendall(wire_codec.encode(wire.Hello(comm_id=123, pid=11, abi_version=1, rank=1)))
    hub = running.agent.hub
    assert hub is not None
    assert wait_until(lambda: sum(c.hello for c in hub.clients) == 2)
    weights = [0.125, 0.125, 0.25, 0.5]
    standin.add_command(
        {
            "command_id": 41,
            "job_id": "j1",
            "kind": "balance",
            "epoch": 3,
            "comm_id": 123,
            "ops_done": 700,
            "disabled_channels": [0],
            "channel_weights": weights,
            "split_ratio": 0.0625,
            "ranks": [0, 1],
        }
    )
    command = wire.Command(
        command_id=41, comm_id=123, ops_done=700, disabled_channels=0b1, kind=6, epoch=3
    )
    assert _recv_messages(new, 2) == [command, wire.CommandWeights.of(41, weights, 0.0625)]
    # ABI 1 would drop the connection on frame 19: it gets the DCR plan it can run.
    assert _recv_messages(old, 1) == [wire.Command(
        command_id=41, comm_id=123, ops_done=700, disabled_channels=0b1, kind=1, epoch=3
    )]  # fmt: skip
    assert standin.wait_for(lambda st: any(b["status"] == "delivered" for _, b in st.acks))
    new.close()
    old.close()


def test_nvl_transit_reaches_abi2_and_fails_where_only_abi1_listens(
    running: AgentThread, standin: StandInService
) -> None:
    s = _connect(running)
    s.sendall(wire_codec.encode(wire.Hello(comm_id=123, pid=10, abi_version=2, rank=4)))
    hub = running.agent.hub
    assert hub is not None
    assert wait_until(lambda: sum(c.hello for c in hub.clients) == 1)
    transit = {
        "job_id": "j1",
        "kind": "nvl_transit",
        "epoch": 1,
        "comm_id": 123,
        "ops_done": 0,
        "disabled_channels": [],
        "transit": [[4, 6]],
        "transit_mb_per_channel": 40,
        "ranks": [4],
    }
    standin.add_command({"command_id": 51, **transit})
    assert _recv_messages(s, 2) == [
        wire.Command(command_id=51, comm_id=123, ops_done=0, disabled_channels=0, kind=7, epoch=1),
        wire.CommandTransit.of(51, {4: 6}, 40),
    ]
    s.close()
    old = _connect(running)
    old.sendall(wire_codec.encode(wire.Hello(comm_id=123, pid=11, abi_version=1, rank=4)))
    assert wait_until(lambda: [c.abi_version for c in hub.clients if c.hello] == [1])
    standin.add_command({"command_id": 52, **transit})
    assert standin.wait_for(
        lambda st: any(cid == 52 and b["status"] == "failed" for cid, b in st.acks)
    )
    ((_, body),) = [(cid, b) for cid, b in standin.state.acks if cid == 52]
    assert "predate ABI 2" in body["detail"]
    old.setblocking(False)
    with pytest.raises(BlockingIOError):
        old.recv(1)
    old.close()


@pytest.mark.parametrize("kind", ["rebalance", "failback", "abort", "failover", "balance",
                                  "checkpoint_now"])  # fmt: skip
def test_every_service_command_kind_has_a_frame(kind: str) -> None:
    frame = to_wire_command(
        {
            "command_id": 1,
            "kind": kind,
            "comm_id": 9,
            "ops_done": 0,
            "epoch": 1,
            "disabled_channels": [0, 63, 64],
        }
    )
    assert frame is not None
    assert frame.kind == wire.CommandKind[kind.upper()]
    # Channels past the 64-bit mask cannot be named on the wire; 0 and 63 can.
    assert frame.disabled_channels == (1 | 1 << 63)
    assert frame.iteration == 0


def test_a_checkpoint_request_carries_its_iteration_byte_for_byte() -> None:
    """checkpoint_now: kind 5 and the failed iteration in the command's last 8 bytes."""
    frame = to_wire_command(
        {"command_id": 7, "kind": "checkpoint_now", "comm_id": 0, "ops_done": 0, "epoch": 3,
         "disabled_channels": [], "iteration": 2**40 + 5}
    )  # fmt: skip
    assert frame is not None
    payload = wire_codec.encode(frame)[wire.HEADER_SIZE :]
    assert payload == struct.pack("<QQQQIIQ", 7, 0, 0, 0, 5, 3, 2**40 + 5)
    assert wire_codec.decode_frame(wire_codec.encode(frame)) == frame


def test_unknown_command_kind_is_acked_failed(
    running: AgentThread, standin: StandInService
) -> None:
    standin.add_command(
        {
            "command_id": 31,
            "job_id": "j",
            "kind": "teleport",
            "epoch": 1,
            "comm_id": 1,
            "ops_done": 0,
            "disabled_channels": [],
            "ranks": [],
        }
    )
    assert standin.wait_for(
        lambda st: any(cid == 31 and b["status"] == "failed" for cid, b in st.acks)
    )
    (body,) = [b for cid, b in standin.state.acks if cid == 31]
    assert "no wire encoding" in body["detail"]


def test_an_answer_with_ops_done_is_relayed_with_it(
    running: AgentThread, standin: StandInService
) -> None:
    # ack_command_at's frame (ACK_AT): the same answer, plus how far the rank was.
    s = _connect(running)
    s.sendall(wire_codec.encode(wire.Hello(comm_id=123, pid=10, abi_version=1, rank=3)))
    s.sendall(wire_codec.encode(wire.AckAt(command_id=17, status=-3, pid=10, ops_done=1234)))
    assert standin.wait_for(lambda st: any(cid == 17 for cid, _ in st.acks))
    (ack,) = [b for cid, b in standin.state.acks if cid == 17]
    # TOO_LATE (-3) is its own status for the service, with the count the rank was at.
    assert (ack["status"], ack["rank"], ack["ops_done"]) == ("too_late", 3, 1234)
    assert ack["detail"] == "too_late at ops_done 1234 (pid 10)"
    s.close()


def test_nccl_profiler_frames_become_communicator_and_stall_events(
    running: AgentThread, standin: StandInService
) -> None:
    s = _connect(running)
    now_ns = time.time_ns()
    comm = wire.Communicator(
        comm_id=0xC0FFEE, timestamp_ns=now_ns, rank=2, nranks=8, n_nodes=2, pid=99,
        host="gpu-a", job="job-7",
    )  # fmt: skip
    frames: list[wire.Message] = [
        wire.Hello(comm_id=0, pid=99, abi_version=1, rank=wire.RANK_UNKNOWN),
        comm,
        comm,  # re-announced (a reconnection): the service hears it once
        wire.Progress(comm_id=0xC0FFEE, ops_done=41, timestamp_ns=now_ns, rank=2, pid=99),
        wire.Stall(
            comm_id=0xC0FFEE, seq_number=41, timestamp_ns=now_ns, open_ns=12_500_000_000,
            rank=2, pid=99, func="AllReduce",
        ),
    ]  # fmt: skip
    s.sendall(b"".join(wire_codec.encode(f) for f in frames))
    assert standin.wait_for(
        lambda st: {e["kind"] for e in st.events.values()} >= {"communicator", "stall", "progress"}
    )
    evs = list(standin.state.events.values())
    comms = [e for e in evs if e["kind"] == "communicator"]
    assert len(comms) == 1
    c = comms[0]
    assert (c["comm_id"], c["rank"], c["nranks"], c["job_id"]) == (0xC0FFEE, 2, 8, "job-7")
    assert c["detail"] == {"n_nodes": 2, "pid": 99, "host": "gpu-a"}
    (stall,) = [e for e in evs if e["kind"] == "stall"]
    assert (stall["comm_id"], stall["rank"], stall["seq_number"]) == (0xC0FFEE, 2, 41)
    assert stall["detail"]["func"] == "AllReduce" and stall["detail"]["open_s"] == 12.5
    assert "device" not in stall  # evidence on the node, not on a NIC
    (progress,) = [e for e in evs if e["kind"] == "progress"]
    assert progress["ops_done"] == 41
    s.close()


def test_the_nccl_profiler_is_sent_no_commands(
    running: AgentThread, standin: StandInService
) -> None:
    profiler = _connect(running)
    profiler.sendall(
        wire_codec.encode(
            wire.Hello(
                comm_id=0, pid=12, abi_version=wire.HELLO_NCCL_PROFILER, rank=wire.RANK_UNKNOWN
            )
        )
    )
    assert wait_until(
        lambda: running.agent.hub is not None and any(c.hello for c in running.agent.hub.clients)
    )
    # comm_id 0 would reach every railoverPlugin client; the profiler reads none.
    standin.add_command(
        {
            "command_id": 8,
            "job_id": "j",
            "kind": "abort",
            "epoch": 1,
            "comm_id": 0,
            "ops_done": 0,
            "disabled_channels": [],
            "ranks": [],
        }
    )
    assert standin.wait_for(
        lambda st: any(cid == 8 and b["status"] == "failed" for cid, b in st.acks), timeout=6
    )
    profiler.settimeout(0.3)
    with pytest.raises(TimeoutError):
        profiler.recv(1)
    profiler.close()
