"""The agent takes its commands on the service's stream, and long-polls a service without it.

Against the real service (both stores), whose streams here last about a second: the
agent opens the next one at each end, asks each for the commands delivered and not
acknowledged, and relays every command to its CCL process once, however often a new
stream sends it again. Against the stand-in, which has no stream (a service from
before it), the agent asks once, is answered 404, and long-polls from then on.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from native_plugin import wire, wire_codec
from railover_testing.agents import AgentThread, StandInService, settings_for
from railover_testing.local import local_service
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import FixtureNode
from railover_testing.waiting import wait_for, wait_until
from scheduler_svc.config import Settings
from tests.agent.plugin_socket import connect, recv_messages
from tests.agent.test_agent_e2e_service import job_on_n0

STREAM_S = 1.0


def _value(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def stream_ends(reason: str) -> float:
    return _value("railover_command_stream_ends_total", {"reason": reason})


def agent_calls(endpoint: str, outcome: str) -> float:
    return _value(
        "railover_agent_service_requests_total", {"endpoint": endpoint, "outcome": outcome}
    )


@pytest.fixture
def service(settings: Settings) -> Iterator[str]:
    # Nobody acknowledges the test's command for the other ranks: no re-issue meanwhile.
    update = {"commands_stream_max_s": STREAM_S, "command_ack_timeout_s": 3600.0}
    with local_service(settings.model_copy(update=update)) as url:
        yield url


class Relayed:
    """Each command the hub is handed, with whether it was new to it."""

    def __init__(self, a: AgentThread) -> None:
        assert a.agent.hub is not None
        hub = a.agent.hub
        self.calls: list[tuple[int, bool]] = []
        real = hub.on_command

        def on_command(cmd: dict[str, Any]) -> bool:
            fresh = real(cmd)
            self.calls.append((int(cmd["command_id"]), fresh))
            return fresh

        # Set on the agent's loop, where the hub is called.
        a.call(lambda: setattr(hub, "on_command", on_command))


def test_streams_end_and_reopen_and_each_command_is_relayed_once(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, service: str
) -> None:
    ended, opened = stream_ends("max_age"), agent_calls("commands_stream", "ok")
    polled = agent_calls("commands", "ok")  # counters of this process: earlier tests' too
    a = AgentThread(settings_for(node_a.root, tmp_path / "agent", service, rail_map_a)).start()
    plugin: socket.socket | None = None
    try:
        assert wait_until(lambda: a.agent.registered is not None, timeout=30)
        relayed = Relayed(a)
        # Streams that end at their age are opened again at once, by the same agent.
        wait_for(
            "two streams ended at their age, and a third one open",
            lambda: (
                stream_ends("max_age") >= ended + 2
                and agent_calls("commands_stream", "ok") >= opened + 3
            ),
            60,
            lambda: (stream_ends("max_age") - ended, agent_calls("commands_stream", "ok") - opened),
        )
        assert agent_calls("commands", "ok") == polled  # no long-poll beside the stream

        plugin = connect(a)
        plugin.sendall(wire_codec.encode(wire.Hello(comm_id=0, pid=100, abi_version=1, rank=0)))
        assert wait_until(
            lambda: a.agent.hub is not None and any(c.hello for c in a.agent.hub.clients)
        )
        job = job_on_n0(datetime.now(UTC).isoformat())
        with httpx.Client(base_url=service, timeout=30) as http:
            assert http.post("/v1/jobs", json=job).status_code == 201
            # Just after a checkpoint a restart is cheaper: an abort for every rank.
            set_port_state(node_a.root, "mlx5_0", 1, "DOWN")
            (cmd,) = recv_messages(plugin, 1, timeout=30)
            assert isinstance(cmd, wire.Command) and cmd.kind == wire.CommandKind.ABORT
            # Unacknowledged by ranks 1-7, it comes again with each new stream; the hub
            # knows it and relays nothing more.
            wait_for(
                "the command sent again by a later stream",
                lambda: (
                    [fresh for cid, fresh in relayed.calls if cid == cmd.command_id][:2]
                    == [True, False]
                ),
                60,
                lambda: relayed.calls,
            )
            plugin.setblocking(False)
            with pytest.raises(BlockingIOError):
                plugin.recv(1)
            listed = http.get("/v1/jobs/j1/commands").json()["commands"]
        assert [(c["command_id"], c["kind"]) for c in listed] == [(cmd.command_id, "abort")]
    finally:
        if plugin is not None:
            plugin.close()
        a.stop()


def test_an_agent_long_polls_a_service_without_the_stream(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, standin: StandInService
) -> None:
    refused = agent_calls("commands_stream", "http_404")
    a = AgentThread(settings_for(node_a.root, tmp_path, standin.url, rail_map_a)).start()
    try:
        plugin = connect(a)
        plugin.sendall(wire_codec.encode(wire.Hello(comm_id=7, pid=10, abi_version=1, rank=0)))
        assert wait_until(
            lambda: a.agent.hub is not None and any(c.hello for c in a.agent.hub.clients)
        )
        polls = agent_calls("commands", "ok")
        standin.add_command(
            {
                "command_id": 3,
                "job_id": "j1",
                "kind": "rebalance",
                "epoch": 1,
                "comm_id": 7,
                "ops_done": 100,
                "disabled_channels": [1],
                "ranks": [],
            }
        )
        (msg,) = recv_messages(plugin, 1, timeout=30)
        assert isinstance(msg, wire.Command) and msg.command_id == 3
        assert agent_calls("commands", "ok") > polls
        # Asked once, refused once: the agent did not go back to the stream.
        assert agent_calls("commands_stream", "http_404") == refused + 1
        plugin.close()
    finally:
        a.stop()


def test_the_agents_stream_timeout_allows_for_its_heartbeat(tmp_path: Path) -> None:
    """A stream is silent for up to heartbeat_s between keepalives: the read timeout is
    that plus one request's timeout, not the request timeout alone."""
    from agent.client import ServiceClient

    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = b'event: end\ndata: {"reason":"max_age"}\n\n'
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    s = settings_for(tmp_path, tmp_path / "w", "http://127.0.0.1:9", command_heartbeat_s=45)
    client = ServiceClient(s, transport=httpx.MockTransport(answer))

    async def read() -> list[tuple[str, dict[str, Any]]]:
        try:
            return [
                e
                async for e in client.stream_commands(s.command_heartbeat_s, include_unacked=False)
            ]
        finally:
            await client.aclose()

    assert asyncio.run(read()) == [("end", {"reason": "max_age"})]
    (req,) = seen
    assert req.url.path == "/v1/nodes/n0/commands/stream"
    assert dict(req.url.params) == {"heartbeat_s": "45.0", "include_unacked": "false"}
    assert req.extensions["timeout"]["read"] == 45 + s.request_timeout_s
    assert req.extensions["timeout"]["connect"] == s.request_timeout_s
