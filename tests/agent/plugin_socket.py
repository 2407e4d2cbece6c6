"""The plugin socket, as the agent's plugin tests reach it: connect, read frames back.

test_agent_plugin.py, test_agent_plugin_commands.py and test_agent_command_stream.py share
these; the `running` agent they connect to is a fixture of tests/agent/conftest.py.
"""

from __future__ import annotations

import socket
import time

from prometheus_client import REGISTRY

from native_plugin import wire, wire_codec
from railover_testing.agents import AgentThread
from railover_testing.waiting import wait_until


def metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def connect(a: AgentThread) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(a.settings.socket))
    return s


def greet(a: AgentThread, *hellos: wire.Hello) -> list[socket.socket]:
    """One connection per HELLO, each sent; returns once the hub counts them all said."""
    hub = a.agent.hub
    assert hub is not None
    before = sum(c.hello for c in hub.clients)
    socks = [connect(a) for _ in hellos]
    for s, hello in zip(socks, hellos, strict=True):
        s.sendall(wire_codec.encode(hello))
    assert wait_until(lambda: sum(c.hello for c in hub.clients) == before + len(hellos))
    return socks


def recv_messages(s: socket.socket, n: int, timeout: float = 5.0) -> list[wire.Message]:
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


def is_closed(s: socket.socket) -> bool:
    s.settimeout(5)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
