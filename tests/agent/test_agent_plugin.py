"""The plugin socket: real unix sockets, frames from native_plugin.wire."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest

from native_plugin import wire, wire_codec
from railover_testing.agents import AgentThread, StandInService, settings_for
from railover_testing.sysfs_node import FixtureNode
from railover_testing.waiting import wait_until
from tests.agent.plugin_socket import connect, is_closed, metric


def test_plugin_events_reach_the_service(running: AgentThread, standin: StandInService) -> None:
    s = connect(running)
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
    before = metric("railover_agent_plugin_malformed_frames_total")
    bad = connect(running)
    good = connect(running)
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
    assert is_closed(bad)
    assert wait_until(lambda: metric("railover_agent_plugin_malformed_frames_total") == before + 1)
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
    third = connect(running)
    third.close()
    good.close()


def test_client_sending_a_command_is_dropped(running: AgentThread) -> None:
    s = connect(running)
    cmd = wire.Command(command_id=1, comm_id=1, ops_done=0, disabled_channels=0, kind=1, epoch=1)
    s.sendall(wire_codec.encode(cmd))
    assert is_closed(s)


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
        connect(a).close()
    finally:
        a.stop()


def test_nccl_profiler_frames_become_communicator_and_stall_events(
    running: AgentThread, standin: StandInService
) -> None:
    s = connect(running)
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
    profiler = connect(running)
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
