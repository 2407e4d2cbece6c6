"""Two jobs' processes on one node: each command reaches only the job it is for.

Issue 28, case 10. Job a's ranks 0-3 and job b's ranks 0-3 run on node n0, neither with a
communicator: every command names comm 0 and rank numbers both jobs use. The processes are
real librailover_plugin.so handles (native_plugin.binding) connected to a real agent; the
service is the stand-in, handing out commands as the service does (job_id, incarnation,
and other_jobs_ranks: the rank numbers other jobs hold on the node).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from native_plugin import wire, wire_codec
from native_plugin.binding import CclCommand, Plugin
from railover_testing.agents import AgentThread, StandInService, settings_for
from railover_testing.sysfs_node import FixtureNode
from railover_testing.waiting import wait_for, wait_until

RANKS = range(4)


@pytest.fixture
def agent(
    node_a: FixtureNode,
    rail_map_a: Path,
    tmp_path: Path,
    standin: StandInService,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[AgentThread]:
    # The library reads these at init: what a test does not give, nobody gives.
    monkeypatch.delenv("RAILOVER_JOB_ID", raising=False)
    monkeypatch.delenv("RAILOVER_JOB_INCARNATION", raising=False)
    a = AgentThread(settings_for(node_a.root, tmp_path, standin.url, rail_map_a)).start()
    yield a
    a.stop()


def connect(agent: AgentThread, plugins: list[Plugin]) -> None:
    """Start the handles and wait for the agent to have their HELLOs too."""
    hub = agent.agent.hub
    assert hub is not None
    before = sum(c.hello for c in hub.clients)
    for p in plugins:
        p.init()
    assert wait_until(lambda: sum(c.hello for c in hub.clients) == before + len(plugins), 10)


def process(
    agent: AgentThread,
    rank: int,
    *,
    job_id: str | None = None,
    incarnation: int = 0,
    comm_id: int = 0,
    abi: int = 3,
) -> Plugin:
    """One CCL process's handle (quick reconnects keep the tests short)."""
    return Plugin(
        socket_path=agent.settings.socket,
        rank=rank,
        comm_id=comm_id,
        job_id=job_id,
        incarnation=incarnation,
        abi=abi,
        reconnect_min_ms=5,
        reconnect_max_ms=50,
    )


def command(cid: int, job: str, kind: str, ranks: list[int], **extra: Any) -> dict[str, Any]:
    """A command as the service delivers it to n0's agent (services/commands.py)."""
    return {
        "command_id": cid,
        "node": "n0",
        "job_id": job,
        "incarnation": 1,
        "kind": kind,
        "epoch": 1,
        "comm_id": 0,
        "ops_done": 0,
        "disabled_channels": [],
        "ranks": ranks,
        "state": "delivered",
        **extra,
    }


def taken(p: Plugin) -> list[CclCommand]:
    out = []
    while (c := p.poll_command_v2()) is not None:
        out.append(c)
    return out


def next_command(p: Plugin, what: str) -> CclCommand:
    got = wait_for(what, p.poll_command_v2, 10, step=0.005)
    assert got is not None
    return got


def acks_of(standin: StandInService, cid: int) -> list[dict[str, Any]]:
    with standin.state.lock:
        return [b for c, b in standin.state.acks if c == cid]


@pytest.fixture
def two_jobs(agent: AgentThread, plugin_lib: Path) -> Iterator[dict[str, list[Plugin]]]:
    jobs = {
        job: [process(agent, r, job_id=job, incarnation=1) for r in RANKS]
        for job in ("job-a", "job-b")
    }
    connect(agent, [p for ps in jobs.values() for p in ps])
    yield jobs
    for ps in jobs.values():
        for p in ps:
            p.finalize()


def test_a_failover_and_an_abort_for_a_reach_only_as_processes(
    agent: AgentThread, standin: StandInService, two_jobs: dict[str, list[Plugin]]
) -> None:
    a, b = two_jobs["job-a"], two_jobs["job-b"]
    # What reached every b process before: its comm_id 0 and rank 2 matched a's command.
    standin.add_command(command(1, "job-a", "failover", [2], other_jobs_ranks=[0, 1, 2, 3]))
    got = next_command(a[2], "a's rank 2 to get its failover")
    assert (got.command_id, got.kind) == (1, wire.CommandKind.FAILOVER)
    # a's restart: every a process aborts, and not one of b's.
    standin.add_command(command(2, "job-a", "abort", list(RANKS), other_jobs_ranks=[0, 1, 2, 3]))
    for r in RANKS:
        got = next_command(a[r], f"a's rank {r} to get the abort")
        assert (got.command_id, got.kind) == (2, wire.CommandKind.ABORT)
    # b's own command comes after a's on each b connection: had the agent sent b a's
    # commands, they would be taken before it.
    standin.add_command(command(3, "job-b", "checkpoint_now", list(RANKS), iteration=40,
                                other_jobs_ranks=[0, 1, 2, 3]))  # fmt: skip
    for r in RANKS:
        got = next_command(b[r], f"b's rank {r} to get its own command")
        assert (got.command_id, got.iteration) == (3, 40)
        assert taken(b[r]) == []
        assert b[r].stats().commands_received == 1
    assert [c.command_id for p in a for c in taken(p)] == []
    assert all(p.stats().commands_received == 1 + (p is a[2]) for p in a)
    assert standin.wait_for(lambda st: {c for c, b in st.acks if b["status"] == "delivered"}
                            == {1, 2, 3})  # fmt: skip


def test_a_process_of_another_incarnation_is_not_sent_the_command(
    agent: AgentThread, standin: StandInService, plugin_lib: Path
) -> None:
    stale = process(agent, 0, job_id="job-a", incarnation=1)
    current = process(agent, 1, job_id="job-a", incarnation=2)
    unknown = process(agent, 2, job_id="job-a")  # no incarnation given: takes any
    connect(agent, [stale, current, unknown])
    try:
        standin.add_command(command(5, "job-a", "abort", [0, 1, 2], incarnation=2))
        assert next_command(current, "incarnation 2's process").command_id == 5
        assert next_command(unknown, "the process that knows no incarnation").command_id == 5
        standin.add_command(command(6, "job-a", "abort", [0], incarnation=2))
        # Nobody of incarnation 2 holds rank 0 here: held for the hold time, then failed.
        assert standin.wait_for(lambda st: any(c == 6 for c, _ in st.acks), timeout=10)
        (failed,) = acks_of(standin, 6)
        assert failed["status"] == "failed" and "another incarnation of 'job-a'" in failed["detail"]
        assert stale.stats().commands_received == 0
    finally:
        for p in (stale, current, unknown):
            p.finalize()


def test_an_old_client_gets_commands_where_no_other_job_can_be_it(
    agent: AgentThread, standin: StandInService, plugin_lib: Path
) -> None:
    """A CCL built against ABI 2 with no RAILOVER_JOB_ID: its HELLO names no job (version 1)."""
    old = process(agent, 1, abi=2)
    connect(agent, [old])
    hub = agent.agent.hub
    assert hub is not None
    assert [(c.job, c.rank) for c in hub.clients] == [("", 1)]
    try:
        # a is alone on the node: the old process can only be a's.
        standin.add_command(command(7, "job-a", "failover", [1], other_jobs_ranks=[]))
        assert next_command(old, "the old client, its job alone on the node").command_id == 7
        # b's rank 5 is here too, not rank 1: still unambiguous.
        standin.add_command(command(8, "job-a", "failover", [1], other_jobs_ranks=[5]))
        assert next_command(old, "the old client, its rank not b's").command_id == 8
        # b holds a rank 1 here as well: the old process may be b's, and gets nothing ...
        standin.add_command(command(9, "job-a", "abort", [0, 1], other_jobs_ranks=[1, 2]))
        assert standin.wait_for(lambda st: any(c == 9 for c, _ in st.acks), timeout=10)
        (failed,) = acks_of(standin, 9)
        assert failed["status"] == "failed"
        assert "1 that named no job could be another job's" in failed["detail"]
        assert "RAILOVER_JOB_ID" in failed["detail"]
        # ... and a service from before other_jobs_ranks cannot say: delivered as before.
        legacy = command(10, "job-a", "failover", [1])
        del legacy["incarnation"]
        standin.add_command(legacy)
        assert next_command(old, "the old client, an older service").command_id == 10
        assert taken(old) == []
    finally:
        old.finalize()


def test_a_named_communicator_tells_an_old_client_apart(
    agent: AgentThread, standin: StandInService, plugin_lib: Path
) -> None:
    """A communicator id is one job's: a process that announced it is that job's, named or not."""
    old = process(agent, 1, abi=1, comm_id=77)
    connect(agent, [old])
    try:
        standin.add_command(command(11, "job-a", "failover", [1], comm_id=77,
                                    other_jobs_ranks=[0, 1, 2, 3]))  # fmt: skip
        assert next_command(old, "comm 77's process").command_id == 11
    finally:
        old.finalize()


def test_a_process_that_names_its_job_through_the_environment(
    agent: AgentThread,
    standin: StandInService,
    plugin_lib: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launcher sets RAILOVER_JOB_ID; a CCL built against ABI 1 then names its job too."""
    monkeypatch.setenv("RAILOVER_JOB_ID", "job-b")
    b = process(agent, 1, abi=1)
    connect(agent, [b])
    monkeypatch.delenv("RAILOVER_JOB_ID")
    a = process(agent, 1, job_id="job-a")
    connect(agent, [a])
    hub = agent.agent.hub
    assert hub is not None
    assert sorted(c.job for c in hub.clients) == ["job-a", "job-b"]
    try:
        standin.add_command(command(12, "job-a", "abort", [1], other_jobs_ranks=[1]))
        assert next_command(a, "a's rank 1").command_id == 12
        standin.add_command(command(13, "job-b", "abort", [1], other_jobs_ranks=[1]))
        assert next_command(b, "b's rank 1").command_id == 13
        assert taken(a) == [] and taken(b) == []
    finally:
        a.finalize()
        b.finalize()


def test_a_pre_version_2_library_still_takes_its_commands(
    agent: AgentThread, standin: StandInService
) -> None:
    """The bytes an older librailover_plugin.so sends: a version-1 HELLO, version-1 frames."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(agent.settings.socket))
    hello = wire_codec.encode(wire.Hello(comm_id=0, pid=77, abi_version=2, rank=3))
    assert hello[4:6] == b"\x01\x00" and len(hello) == 16 + 24
    s.sendall(hello)
    hub = agent.agent.hub
    assert hub is not None
    assert wait_until(lambda: any(c.hello for c in hub.clients))
    standin.add_command(command(14, "job-a", "failover", [3], other_jobs_ranks=[]))
    data = b""
    deadline = time.monotonic() + 5
    while len(data) < 16 + 48 and time.monotonic() < deadline:
        data += s.recv(4096)
    # A version-1 COMMAND: what a plugin before version 2 accepts, and nothing else.
    assert data[4:6] == b"\x01\x00"
    (cmd,) = wire_codec.FrameDecoder().feed(data)
    assert isinstance(cmd, wire.Command) and cmd.command_id == 14
    s.close()


def test_progress_says_whose_count_it_is(
    agent: AgentThread, standin: StandInService, two_jobs: dict[str, list[Plugin]]
) -> None:
    """Rank 1 of each job reports its op count on comm 0: each count reaches the service
    with the job and incarnation its process named, so the service can tell them apart
    (and keep an ended incarnation's from the new one); an old client's names neither."""
    old = process(agent, 2, abi=2)
    connect(agent, [old])
    try:
        assert two_jobs["job-a"][1].report_progress(0, 1, 100)
        assert two_jobs["job-b"][1].report_progress(0, 1, 7)
        assert old.report_progress(0, 2, 55)

        def sent() -> dict[int, dict[str, Any]]:
            with standin.state.lock:
                evs = [e for e in standin.state.events.values() if e["kind"] == "progress"]
            return {e["ops_done"]: e for e in evs}

        wait_for("the three counts", lambda: len(sent()) == 3, 10)
        got = sent()
        assert {
            ops: (e.get("job_id"), e.get("incarnation"), e["rank"]) for ops, e in got.items()
        } == {
            100: ("job-a", 1, 1),
            7: ("job-b", 1, 1),
            55: (None, None, 2),
        }
    finally:
        old.finalize()
