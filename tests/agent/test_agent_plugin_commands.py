"""The plugin socket: commands relayed to the ranks' clients and their acks sent back,
with real unix sockets and frames from native_plugin.wire."""

from __future__ import annotations

import struct
import threading

import pytest
from prometheus_client import REGISTRY

from agent.plugin import to_wire_command
from native_plugin import wire, wire_codec
from railover_testing.agents import AgentThread, StandInService
from railover_testing.waiting import wait_until
from tests.agent.plugin_socket import connect, greet, recv_messages


def test_commands_are_relayed_and_acked(running: AgentThread, standin: StandInService) -> None:
    mine = connect(running)
    other = connect(running)
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
    (msg,) = recv_messages(mine, 1)
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
    socks = greet(
        running, *(wire.Hello(comm_id=123, pid=100 + r, abi_version=1, rank=r) for r in ranks)
    )
    hub = running.agent.hub
    assert hub is not None
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
        assert len(recv_messages(s, 1)) == 1
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
    (s,) = greet(running, wire.Hello(comm_id=123, pid=10, abi_version=1, rank=3))
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
    assert len(recv_messages(s, 2)) == 2
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
    late = connect(running)
    late.sendall(wire_codec.encode(wire.Hello(comm_id=42, pid=9, abi_version=1, rank=1)))
    (msg,) = recv_messages(late, 1)
    assert (
        isinstance(msg, wire.Command) and msg.command_id == 5 and msg.kind == wire.CommandKind.ABORT
    )
    # Nobody for comm 43 within COMMAND_HOLD_S (2 s in tests): acked failed, not lost.
    assert standin.wait_for(
        lambda st: any(cid == 6 and b["status"] == "failed" for cid, b in st.acks), timeout=6
    )
    late.close()


def test_balance_goes_with_its_weights_to_abi2_and_as_a_rebalance_to_abi1(
    running: AgentThread, standin: StandInService
) -> None:
    new, old = greet(
        running,
        wire.Hello(comm_id=123, pid=10, abi_version=2, rank=0),
        wire.Hello(comm_id=123, pid=11, abi_version=1, rank=1),
    )
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
    assert recv_messages(new, 2) == [command, wire.CommandWeights.of(41, weights, 0.0625)]
    # ABI 1 would drop the connection on frame 19: it gets the DCR plan it can run.
    assert recv_messages(old, 1) == [wire.Command(
        command_id=41, comm_id=123, ops_done=700, disabled_channels=0b1, kind=1, epoch=3
    )]  # fmt: skip
    assert standin.wait_for(lambda st: any(b["status"] == "delivered" for _, b in st.acks))
    new.close()
    old.close()


def test_nvl_transit_reaches_abi2_and_fails_where_only_abi1_listens(
    running: AgentThread, standin: StandInService
) -> None:
    (s,) = greet(running, wire.Hello(comm_id=123, pid=10, abi_version=2, rank=4))
    hub = running.agent.hub
    assert hub is not None
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
    assert recv_messages(s, 2) == [
        wire.Command(command_id=51, comm_id=123, ops_done=0, disabled_channels=0, kind=7, epoch=1),
        wire.CommandTransit.of(51, {4: 6}, 40),
    ]
    s.close()
    old = connect(running)
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
    (s,) = greet(running, wire.Hello(comm_id=123, pid=10, abi_version=1, rank=3))
    standin.add_command(
        {"command_id": 17, "job_id": "j1", "kind": "rebalance", "epoch": 1, "comm_id": 123,
         "ops_done": 1000, "disabled_channels": [1], "ranks": [3]}
    )  # fmt: skip
    assert len(recv_messages(s, 1)) == 1
    s.sendall(wire_codec.encode(wire.AckAt(command_id=17, status=-3, pid=10, ops_done=1234)))
    assert standin.wait_for(lambda st: any(b["status"] == "too_late" for _, b in st.acks))
    (ack,) = [b for cid, b in standin.state.acks if cid == 17 and b["status"] != "delivered"]
    # TOO_LATE (-3) is its own status for the service, with the count the rank was at.
    assert (ack["status"], ack["rank"], ack["ops_done"]) == ("too_late", 3, 1234)
    assert ack["detail"] == "too_late at ops_done 1234 (pid 10)"
    s.close()
