"""The C library through the ctypes binding, against a Python stand-in agent."""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypedDict

import pytest

from native_plugin import wire, wire_codec
from native_plugin.abi import PluginError, PluginLibraryNotFoundError, Stats, load_library
from native_plugin.binding import AgreeAction, AgreeOutcome, CclCommand, Plugin, SwitchVote, agree
from railover_testing.fake_agent import FakeAgent
from railover_testing.waiting import wait_until as poll_until


class _Fast(TypedDict):
    reconnect_min_ms: int
    reconnect_max_ms: int


# Quick reconnects keep the tests short.
FAST: _Fast = {"reconnect_min_ms": 5, "reconnect_max_ms": 20}


def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    if not poll_until(cond, timeout=timeout, step=0.002):
        raise AssertionError("condition not reached in time")


def drained(plugin: Plugin, agent: FakeAgent) -> Callable[[], bool]:
    def check() -> bool:
        s = plugin.stats()
        return s.queued == 0 and agent.reports == s.sent

    return check


def test_missing_library_names_path_and_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nope.so"
    with pytest.raises(PluginLibraryNotFoundError, match="make -C native_plugin") as info:
        load_library(missing)
    assert str(missing) in str(info.value)


def test_library_path_from_environment(
    plugin_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAILOVER_PLUGIN_LIB", str(tmp_path / "other.so"))
    with pytest.raises(PluginLibraryNotFoundError, match=r"other\.so"):
        Plugin()
    monkeypatch.setenv("RAILOVER_PLUGIN_LIB", str(plugin_lib))
    assert Plugin().stats is not None


def test_bad_ring_size_from_environment(
    plugin_lib: Path, agent_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAILOVER_PLUGIN_RING_SIZE", "lots")
    lines: list[str] = []
    with pytest.raises(PluginError, match="configuration"):
        Plugin(socket_path=agent_path, log=lambda _lvl, msg: lines.append(msg)).init()
    assert any("RAILOVER_PLUGIN_RING_SIZE" in line for line in lines)


def test_socket_path_from_environment(
    plugin_lib: Path, agent: FakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAILOVER_PLUGIN_SOCKET", str(agent.path))
    with Plugin(rank=5, comm_id=9, **FAST) as plugin:
        wait_until(lambda: plugin.stats().connected == 1)
        wait_until(lambda: len(agent.hellos) == 1)
    hello = agent.hellos[0]
    assert (hello.rank, hello.comm_id, hello.abi_version) == (5, 9, 3)


def test_the_hello_names_the_job_given_else_the_environments(
    plugin_lib: Path, agent: FakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ABI 3: init_v3's job and incarnation; the older tables' init, RAILOVER_JOB_ID's."""
    monkeypatch.delenv("RAILOVER_JOB_ID", raising=False)
    monkeypatch.delenv("RAILOVER_JOB_INCARNATION", raising=False)
    # (abi, job_id, incarnation, environment)
    runs: list[tuple[int, str | None, int, dict[str, str]]] = [
        (3, "llm-7", 3, {}),
        (2, None, 0, {"RAILOVER_JOB_ID": "from-env", "RAILOVER_JOB_INCARNATION": "9"}),
        (1, None, 0, {"RAILOVER_JOB_ID": "from-env"}),
        (3, "given", 0, {"RAILOVER_JOB_ID": "from-env"}),
        (2, None, 0, {}),
    ]
    for n, (abi, job_id, incarnation, env) in enumerate(runs, start=1):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        plugin = Plugin(
            socket_path=agent.path, rank=n, abi=abi, job_id=job_id, incarnation=incarnation, **FAST
        )
        with plugin:
            wait_until(lambda: len(agent.hellos) == n)  # noqa: B023  # called in this turn
        for name in env:
            monkeypatch.delenv(name)
    named = [(h.rank, h.job, h.incarnation, h.abi_version) for h in agent.hellos]
    assert named == [
        (1, "llm-7", 3, 3),
        (2, "from-env", 9, 3),
        (3, "from-env", 0, 3),
        (4, "given", 0, 3),
        (5, "", 0, 3),  # named no job: the version-1 HELLO
    ]
    with pytest.raises(PluginError, match="need init_v3"):
        Plugin(socket_path=agent.path, abi=2, job_id="x")


def test_a_job_id_that_does_not_fit_is_refused_at_init(plugin_lib: Path, agent_path: Path) -> None:
    lines: list[str] = []
    with pytest.raises(PluginError, match="configuration"):
        Plugin(socket_path=agent_path, job_id="j" * 256, log=lambda _l, m: lines.append(m)).init()
    assert any("at most 255 fit" in line for line in lines)


def test_calls_after_finalize_raise(plugin_lib: Path, agent_path: Path) -> None:
    plugin = Plugin(socket_path=agent_path)
    with plugin:
        pass
    with pytest.raises(PluginError, match="not initialised"):
        plugin.report_progress(1, 0, 1)
    plugin.finalize()  # idempotent


def test_reports_before_the_first_connection_wait_for_it(
    plugin_lib: Path, agent_path: Path
) -> None:
    with Plugin(socket_path=agent_path, ring_size=1024, **FAST) as plugin:
        # Made right after init, before the sender has reached any agent: the
        # ring keeps what fits, and only the rest is dropped (as ring full).
        results = [plugin.report_progress(1, 0, i) for i in range(10_000)]
        assert results == [True] * 1024 + [False] * (10_000 - 1024)
        s = plugin.stats()
        assert (s.queued, s.dropped_ring_full, s.dropped_no_agent, s.sent) == (1024, 8976, 0, 0)
        wait_until(lambda: plugin.stats().connect_failures >= 1)
        assert plugin.stats().queued == 1024  # failed attempts do not throw them away

        agent = FakeAgent(agent_path)
        try:
            wait_until(lambda: plugin.stats().connected == 1)
            wait_until(lambda: agent.counts[wire.Progress] == 1024)
            assert plugin.report_port_event("mlx5_0", 1, 10)
            assert plugin.report_cqe_error("mlx5_0", 1, 0x12, 12, 0x81, "node-7")
            assert plugin.report_path_switch(1, 3, "mlx5_0", "mlx5_1", wire.SwitchReason.FAILOVER)
            wait_until(lambda: agent.reports == 1024 + 3)
            assert agent.counts[wire.PortEvent] == 1
            assert agent.counts[wire.CqeError] == 1
            assert agent.counts[wire.PathSwitch] == 1
            s = plugin.stats()
            assert (s.sent, s.queued, s.dropped_no_agent) == (1027, 0, 0)
        finally:
            agent.close()
        # An agent that was there and went away is another matter: nothing
        # says it comes back soon, so reports made meanwhile are dropped.
        wait_until(lambda: plugin.stats().connected == 0)
        assert not plugin.report_progress(1, 0, 1)
        assert plugin.stats().dropped_no_agent == 1


def test_reports_made_before_any_agent_are_dropped_at_finalize(
    plugin_lib: Path, agent_path: Path
) -> None:
    plugin = Plugin(socket_path=agent_path, drain_timeout_ms=10, **FAST)
    plugin.init()
    assert plugin.report_progress(1, 0, 1)
    assert plugin.stats().queued == 1
    plugin.finalize()  # no agent ever came: the one queued report had nowhere to go


def test_agent_restart_reconnects(plugin_lib: Path, agent_path: Path) -> None:
    with Plugin(socket_path=agent_path, **FAST) as plugin:
        first = FakeAgent(agent_path)
        wait_until(lambda: plugin.stats().connected == 1)
        first.close()
        wait_until(lambda: plugin.stats().connected == 0)
        second = FakeAgent(agent_path)
        try:
            wait_until(lambda: plugin.stats().connected == 1)
            assert plugin.report_progress(1, 0, 1)
            wait_until(lambda: second.reports == 1)
            assert plugin.stats().connects == 2
        finally:
            second.close()


def test_command_reaches_poll_and_ack_reaches_agent(plugin_lib: Path, agent: FakeAgent) -> None:
    cmd = wire.Command(
        command_id=42,
        comm_id=7,
        ops_done=1000,
        disabled_channels=0b1010,
        kind=wire.CommandKind.REBALANCE,
        epoch=3,
    )
    pid = os.getpid()
    with Plugin(socket_path=agent.path, **FAST) as plugin:
        wait_until(lambda: plugin.stats().connected == 1)
        assert plugin.poll_command() is None
        agent.send(wire_codec.encode(cmd))
        got: list[wire.Command] = []

        def polled() -> bool:
            c = plugin.poll_command()
            if c is not None:
                got.append(c)
            return bool(got)

        wait_until(polled)
        assert got == [cmd]
        assert plugin.ack_command(42, wire.AckStatus.TOO_LATE)
        wait_until(lambda: len(agent.acks) == 1)
        assert agent.acks[0] == wire.Ack(command_id=42, status=wire.AckStatus.TOO_LATE, pid=pid)
        # The answer that says how far the rank was travels as its own frame type.
        assert plugin.ack_command_at(42, wire.AckStatus.TOO_LATE, 1017)
        wait_until(lambda: len(agent.acks) == 2)
        assert agent.acks[1] == wire.AckAt(
            command_id=42, status=wire.AckStatus.TOO_LATE, pid=pid, ops_done=1017
        )
        s = plugin.stats()
        assert (s.commands_received, s.acks_sent) == (1, 2)


def _poll_v2(plugin: Plugin) -> CclCommand:
    got: list[CclCommand] = []

    def polled() -> bool:
        c = plugin.poll_command_v2()
        if c is not None:
            got.append(c)
        return bool(got)

    wait_until(polled)
    return got[0]


def test_balance_and_transit_reach_poll_command_v2(plugin_lib: Path, agent: FakeAgent) -> None:
    weights = (0.0, 0.25, 0.375, 0.375)
    balance = wire.Command(command_id=50, comm_id=7, ops_done=900, disabled_channels=0b1,
                           kind=wire.CommandKind.BALANCE, epoch=4)  # fmt: skip
    nvl = wire.Command(command_id=51, comm_id=7, ops_done=0, disabled_channels=0,
                       kind=wire.CommandKind.NVL_TRANSIT, epoch=4)  # fmt: skip
    with Plugin(socket_path=agent.path, **FAST) as plugin:
        wait_until(lambda: plugin.stats().connected == 1)
        agent.send(
            wire_codec.encode(balance)
            + wire_codec.encode(wire.CommandWeights.of(50, weights, 0.125))
        )
        assert _poll_v2(plugin) == CclCommand(
            command_id=50, comm_id=7, ops_done=900, disabled_channels=0b1,
            kind=wire.CommandKind.BALANCE, epoch=4, split_ratio=0.125, weights=weights,
        )  # fmt: skip
        agent.send(
            wire_codec.encode(nvl) + wire_codec.encode(wire.CommandTransit.of(51, {6: 1, 2: 3}, 40))
        )
        assert _poll_v2(plugin) == CclCommand(
            command_id=51, comm_id=7, ops_done=0, disabled_channels=0,
            kind=wire.CommandKind.NVL_TRANSIT, epoch=4, mb_per_channel=40,
            transit=((2, 3), (6, 1)),
        )  # fmt: skip
        # The ABI 1 call sees the balance as the DCR plan it carries.
        agent.send(
            wire_codec.encode(balance)
            + wire_codec.encode(wire.CommandWeights.of(50, weights, 0.125))
        )
        got: list[wire.Command] = []

        def polled_v1() -> bool:
            c = plugin.poll_command()
            if c is not None:
                got.append(c)
            return bool(got)

        wait_until(polled_v1)
        assert got == [replace(balance, kind=wire.CommandKind.REBALANCE)]
        assert plugin.stats().commands_invalid == 0


def test_bad_weights_are_answered_failed(plugin_lib: Path, agent: FakeAgent) -> None:
    cmd = wire.Command(command_id=60, comm_id=7, ops_done=900, disabled_channels=0,
                       kind=wire.CommandKind.BALANCE, epoch=1)  # fmt: skip
    good = wire_codec.encode(wire.CommandWeights.of(60, (0.5, 0.5), 0.0))
    # NaN in weight 1, by hand: the encoder refuses to write one.
    nan = good[: 16 + 16 + 4] + struct.pack("<f", float("nan")) + good[16 + 16 + 8 :]
    with Plugin(socket_path=agent.path, **FAST) as plugin:
        wait_until(lambda: plugin.stats().connected == 1)
        agent.send(wire_codec.encode(cmd) + nan)
        wait_until(lambda: len(agent.acks) == 1)
        assert agent.acks[0] == wire.Ack(
            command_id=60, status=wire.AckStatus.FAILED, pid=os.getpid()
        )
        s = plugin.stats()
        assert (s.commands_invalid, s.connected, s.malformed_received) == (1, 1, 0)
        assert plugin.poll_command_v2() is None


def test_unknown_command_kind_is_refused_by_the_plugin(plugin_lib: Path, agent: FakeAgent) -> None:
    with Plugin(socket_path=agent.path, **FAST) as plugin:
        wait_until(lambda: plugin.stats().connected == 1)
        future = wire.Command(
            command_id=5, comm_id=1, ops_done=0, disabled_channels=0, kind=99, epoch=1
        )
        agent.send(wire_codec.encode(future))
        wait_until(lambda: len(agent.acks) == 1)
        assert agent.acks[0].status == wire.AckStatus.UNSUPPORTED
        assert plugin.poll_command() is None


def test_garbage_from_agent_drops_connection_and_reconnects(
    plugin_lib: Path, agent: FakeAgent
) -> None:
    with Plugin(socket_path=agent.path, **FAST) as plugin:
        wait_until(lambda: agent.connections == 1 and len(agent.hellos) == 1)
        agent.send(b"\xff" * 40)
        wait_until(lambda: plugin.stats().malformed_received == 1)
        wait_until(lambda: len(agent.hellos) == 2)
        assert plugin.report_progress(1, 2, 3)
        wait_until(lambda: agent.reports == 1)


def test_four_threads_quarter_million_each_account_exactly(
    plugin_lib: Path, agent: FakeAgent
) -> None:
    per_thread = 250_000
    threads = 4
    queued = [0] * threads
    with Plugin(socket_path=agent.path, ring_size=65536, **FAST) as plugin:
        wait_until(lambda: plugin.stats().connected == 1)
        report = plugin.report_progress

        def produce(idx: int) -> None:
            ok = 0
            for i in range(per_thread):
                ok += report(7, idx, i)
            queued[idx] = ok

        workers = [threading.Thread(target=produce, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wait_until(drained(plugin, agent), timeout=60)
        s: Stats = plugin.stats()

    made = threads * per_thread
    assert s.sent + s.dropped == made
    assert agent.reports == s.sent == sum(queued)
    assert agent.counts[wire.Progress] == s.sent
    assert s.dropped_no_agent == 0
    assert not agent.errors


def test_drops_are_logged_at_a_rate_limit(plugin_lib: Path, agent_path: Path) -> None:
    lines: list[str] = []
    with Plugin(
        socket_path=agent_path,
        ring_size=16,
        log_interval_ms=50,
        log=lambda _lvl, m: lines.append(m),
        **FAST,
    ) as plugin:
        # No agent: 16 wait in the ring for one, the rest have no room.
        for i in range(1016):
            plugin.report_progress(1, 0, i)
        wait_until(lambda: any("dropped 1000 reports" in line for line in lines))
        for i in range(500):
            plugin.report_progress(1, 0, i)
        wait_until(lambda: any("dropped 500 reports" in line for line in lines))
    drop_lines = [line for line in lines if "dropped" in line]
    # One summary per burst, not one line per drop; connection failures once per streak.
    # The last summary is finalize's: the 16 that waited in the ring for an agent.
    assert len(drop_lines) == 3, drop_lines
    assert "dropped 16 reports" in drop_lines[2] and "16 no agent" in drop_lines[2]
    assert sum("not reachable" in line for line in lines) == 1


def test_agree_through_the_binding(plugin_lib: Path) -> None:
    """The header's switch-point rules, as the library decides them (a pure call, no handle)."""
    armed = SwitchVote(ops_done=10, switch_at=20, disabled_channels=0b11, epoch=3, kind=1)
    idle = SwitchVote(ops_done=10)
    everyone = agree([armed, armed, armed], 1)
    assert (everyone.outcome, everyone.action) == (AgreeOutcome.APPLY, AgreeAction.COMMIT)
    assert (everyone.epoch, everyone.switch_at, everyone.max_ops_done) == (3, 20, 10)
    # One rank has not seen it yet but is below N: undecided, everyone stays armed.
    assert agree([armed, idle, armed], 0).outcome == AgreeOutcome.WAIT
    # That rank reached N without it: nobody applies it; who armed it answers TOO_LATE.
    at_n = SwitchVote(ops_done=20)
    late = [SwitchVote(20, 20, 0b11, 3, 1), at_n, SwitchVote(20, 20, 0b11, 3, 1)]
    assert agree(late, 0).outcome == AgreeOutcome.REJECT
    assert agree(late, 0).action == AgreeAction.TOO_LATE
    assert agree(late, 1).action == AgreeAction.KEEP  # it had nothing to give up
    with pytest.raises(PluginError, match="invalid"):
        agree([], 0)
    with pytest.raises(PluginError, match="invalid"):
        agree([armed], 1)
