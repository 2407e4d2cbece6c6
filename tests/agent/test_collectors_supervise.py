"""The collector supervisor: timeouts, a stuck run isolated and its late findings, the schedule.

The collectors here are stand-ins whose runs the test scripts (return, fail, block on an
event, take so many seconds). The supervisor reads its time from a fake clock, and the
sleeps it asks for pass on that clock at once, so a schedule of minutes takes
milliseconds and durations are exact. Timeouts are the event loop's own (real): a run
that must overrun its timeout blocks until the test releases it, and one that must not
has seconds to spare.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent.collectors import supervise
from agent.collectors.base import Collected, Collector, CollectorContext
from agent.collectors.counters import CountersCollector
from agent.collectors.supervise import Supervisor
from agent.collectors.topology import TopologyCollector
from agent.config import AgentSettings
from agent.topology import Gpu, Topology
from railover_testing.sysfs_faults import bump_counter
from railover_testing.sysfs_node import FixtureNode
from railover_testing.waiting import wait_for

T0 = 1000.0
WAIT_S = 10.0  # for a run that returns at once: never reached unless something is broken


class Clock:
    """What the supervisor knows as ``time``: moved by the test, a run, or a sleep."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _InstantSleeps:
    """``asyncio`` as the supervisor sees it, but a sleep passes on the fake clock at once."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float) -> None:
        self._clock.advance(delay)
        await asyncio.sleep(0)  # still a turn of the event loop, as a sleep is


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(supervise, "time", c)
    monkeypatch.setattr(supervise, "asyncio", _InstantSleeps(c))
    return c


Run = Callable[[Topology | None], Collected]


class Fake(Collector):
    """A collector whose runs are scripted; after the script, runs find nothing."""

    name = "fake"

    def __init__(self, *runs: Run, timeout_s: float = WAIT_S, interval_s: float = 10.0) -> None:
        # No CollectorContext: the supervisor uses only the name, the schedule and collect().
        self.runs = list(runs)
        self._timeout_s = timeout_s
        self._interval_s = interval_s
        self.handed: list[Topology | None] = []
        self.threads: list[threading.Thread] = []

    def timeout_s(self) -> float:
        return self._timeout_s

    def interval_s(self) -> float:
        return self._interval_s

    def collect(self, topology: Topology | None) -> Collected:
        self.handed.append(topology)
        self.threads.append(threading.current_thread())
        return self.runs.pop(0)(topology) if self.runs else Collected()


def fake(name: str, *runs: Run, provides_topology: bool = False, **schedule: float) -> Fake:
    cls = type(f"Fake_{name}", (Fake,), {"name": name, "provides_topology": provides_topology})
    made: Fake = cls(*runs, **schedule)
    return made


def found(mark: str, topology: Topology | None = None) -> Run:
    return lambda _: Collected(state={"run": mark}, topology=topology)


def raising(exc: BaseException, clock: Clock, seconds: float) -> Run:
    def run(_: Topology | None) -> Collected:
        clock.advance(seconds)
        raise exc

    return run


def blocked(gate: threading.Event, mark: str) -> Run:
    """A run stuck (as in a read of a wedged driver's file) until the test sets ``gate``."""

    def run(_: Topology | None) -> Collected:
        assert gate.wait(60), "the test never released this run"
        return Collected(state={"run": mark})

    return run


class Inbox:
    """The ``deliver`` callback: what reached the agent, in order."""

    def __init__(self) -> None:
        self.got: list[tuple[str, Collected]] = []
        self._changed: asyncio.Event | None = None

    def __call__(self, c: Collector, got: Collected) -> None:
        self.got.append((c.name, got))
        if self._changed is not None:
            self._changed.set()

    def marks(self) -> list[tuple[str, Any]]:
        return [(name, got.state.get("run")) for name, got in self.got]

    async def until(self, what: str, n: int) -> None:
        """Wait (on the event loop, which delivers) until ``n`` results have arrived."""
        try:
            async with asyncio.timeout(WAIT_S):
                while len(self.got) < n:
                    self._changed = asyncio.Event()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"waiting for {what}: got {self.marks()}") from None


async def until_thread(what: str, check: Callable[[], object]) -> None:
    """Wait for something a worker thread does, leaving the event loop free meanwhile."""
    await asyncio.to_thread(wait_for, what, check, WAIT_S)


def success(name: str) -> float | None:
    return REGISTRY.get_sample_value("railover_agent_collector_success", {"collector": name})


def duration(name: str) -> float | None:
    return REGISTRY.get_sample_value(
        "railover_agent_collector_duration_seconds", {"collector": name}
    )


def logged(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == supervise.log.name and r.levelno == level
    ]


def snapshot(gpus: int) -> Topology:
    """A topology told apart by its number of GPUs."""
    return Topology(
        gpus=tuple(
            Gpu(
                index=i,
                pci=f"0000:{i + 1:02x}:00.0",
                numa=None,
                pcie_switch=None,
                root_complex=None,
                nvlink=None,
            )
            for i in range(gpus)
        )
    )


# --- threads ---------------------------------------------------------------------------------


def test_each_collector_runs_in_its_own_daemon_thread_named_after_it(clock: Clock) -> None:
    given = snapshot(2)
    a, b = fake("sup-a"), fake("sup-b")
    inbox = Inbox()
    sup = Supervisor([a, b], inbox, topology=given)
    try:
        asyncio.run(sup.first_round())
        asyncio.run(sup.run_once(a))
    finally:
        sup.close()
    assert sorted(name for name, _ in inbox.got) == ["sup-a", "sup-a", "sup-b"]
    # Before any discovery the runs are handed the snapshot the supervisor was made with.
    assert a.handed == [given, given] and b.handed == [given]
    assert a.handed[0] is given
    # One thread per collector, the same for all its runs, named for a thread dump; a
    # daemon, so a run stuck in the kernel cannot keep the agent from exiting.
    assert a.threads[0] is a.threads[1]
    assert a.threads[0] is not b.threads[0]
    assert [t.name for t in (a.threads[0], b.threads[0])] == ["collector-sup-a", "collector-sup-b"]
    assert a.threads[0].daemon and b.threads[0].daemon
    assert threading.main_thread() not in (a.threads[0], b.threads[0])
    # close() lets the idle workers end.
    for t in (a.threads[0], b.threads[0]):
        t.join(timeout=WAIT_S)
        assert not t.is_alive()


def test_a_run_that_returns_after_the_agent_stopped_ends_quietly(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    c = fake("sup-orphan", blocked(gate, "orphan"), timeout_s=0.05)
    inbox = Inbox()
    sup = Supervisor([c], inbox)
    try:
        asyncio.run(sup.run_once(c))  # overruns; the loop closes with the run still stuck
        crashed: list[threading.ExceptHookArgs] = []
        monkeypatch.setattr(threading, "excepthook", crashed.append)
        gate.set()  # returns to a closed loop: nobody to deliver to
    finally:
        gate.set()
        sup.close()
    (worker,) = c.threads
    worker.join(timeout=WAIT_S)
    assert not worker.is_alive()
    assert crashed == []
    assert inbox.got == []


# --- timeouts, failures, late runs -----------------------------------------------------------


def test_a_stuck_run_fails_at_its_timeout_is_skipped_and_what_it_finds_comes_late(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=supervise.log.name)
    first, second = threading.Event(), threading.Event()
    stuck = fake(
        "sup-stuck",
        found("ok"),
        blocked(first, "late"),
        found("after"),
        blocked(second, "late again"),
        timeout_s=0.05,
    )
    other = fake("sup-other")
    inbox = Inbox()
    sup = Supervisor([stuck, other], inbox)
    skip = "collector sup-stuck is stuck in its last run; skipping it until it returns"

    async def story() -> None:
        await sup.run_once(stuck)
        assert success("sup-stuck") == 1
        # The next run hangs: reported failed at its timeout; the other collector's run,
        # at the same time, goes through.
        await asyncio.gather(sup.run_once(stuck), sup.run_once(other))
        assert success("sup-stuck") == 0
        assert success("sup-other") == 1
        assert inbox.marks() == [("sup-stuck", "ok"), ("sup-other", None)]
        assert logged(caplog) == ["collector sup-stuck has not returned within 0.05s"]
        # Not started again while its run is stuck; the skip is logged once, not every tick.
        await sup.run_once(stuck)
        await sup.run_once(stuck)
        assert len(stuck.handed) == 2
        assert success("sup-stuck") == 0
        assert logged(caplog)[1:] == [skip]
        # It returns 7 s later: what it found is delivered, the run still counts as failed.
        clock.advance(7)
        first.set()
        await inbox.until("the late run's findings", 3)
        assert inbox.marks()[2] == ("sup-stuck", "late")
        assert success("sup-stuck") == 0
        assert duration("sup-stuck") == 7.0
        assert logged(caplog)[2:] == ["collector sup-stuck took 7.0s (timeout 0.05s)"]
        # Its next run is a run like any other.
        await sup.run_once(stuck)
        assert inbox.marks()[3] == ("sup-stuck", "after")
        assert success("sup-stuck") == 1
        # Stuck again another day: skipped, and that is logged again.
        await sup.run_once(stuck)
        await sup.run_once(stuck)
        assert len(stuck.handed) == 4
        assert logged(caplog).count(skip) == 2
        second.set()
        await inbox.until("the second late run's findings", 5)

    try:
        asyncio.run(story())
    finally:
        first.set()
        second.set()
        sup.close()
    assert success("None") is None  # every series is named for its collector
    assert duration("None") is None


def test_a_run_asked_for_while_the_last_is_still_going_is_skipped_as_failed(
    clock: Clock,
) -> None:
    gate = threading.Event()
    c = fake("sup-slow", found("one"), blocked(gate, "two"), timeout_s=60)
    inbox = Inbox()
    sup = Supervisor([c], inbox)

    async def story() -> None:
        await sup.run_once(c)
        assert success("sup-slow") == 1
        going = asyncio.create_task(sup.run_once(c))
        await until_thread("the second run to start", lambda: len(c.handed) == 2)
        # Within its timeout still, but a tick came and went without a run: failed.
        await sup.run_once(c)
        assert len(c.handed) == 2
        assert success("sup-slow") == 0
        gate.set()
        await going  # returned within its timeout after all
        assert success("sup-slow") == 1

    try:
        asyncio.run(story())
    finally:
        gate.set()
        sup.close()
    assert inbox.marks() == [("sup-slow", "one"), ("sup-slow", "two")]


def test_a_failing_run_is_reported_with_its_error_and_the_next_goes_on(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=supervise.log.name)
    boom = OSError("read of link_downed failed")
    c = fake("sup-fail", found("one"), raising(boom, clock, 2.5), found("three"))
    inbox = Inbox()
    sup = Supervisor([c], inbox)

    async def story() -> None:
        await sup.run_once(c)
        assert success("sup-fail") == 1
        # Reported as soon as it fails, not at the timeout.
        await sup.run_once(c)
        assert success("sup-fail") == 0
        assert duration("sup-fail") == 2.5
        (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert record.getMessage() == "collector sup-fail failed"
        assert record.exc_info is not None and record.exc_info[1] is boom
        assert logged(caplog) == []  # not taken for a timeout
        # The worker survived it: the next run runs.
        await sup.run_once(c)
        assert success("sup-fail") == 1

    try:
        asyncio.run(story())
    finally:
        sup.close()
    assert inbox.marks() == [("sup-fail", "one"), ("sup-fail", "three")]
    assert success("None") is None


def test_a_delivery_that_fails_is_the_supervisors_failure(clock: Clock) -> None:
    c = fake("sup-spool", found("one"))

    def deliver(_: Collector, __: Collected) -> None:
        raise OSError("spool: no space left on device")

    sup = Supervisor([c], deliver)
    try:
        with pytest.raises(OSError, match="no space left"):
            asyncio.run(sup.run_once(c))
    finally:
        sup.close()
    assert success("sup-spool") == 1  # the collector itself did its part


# --- the topology snapshot -------------------------------------------------------------------


def test_only_the_topology_collectors_results_replace_the_snapshot(clock: Clock) -> None:
    t0, t1, t2 = snapshot(0), snapshot(1), snapshot(2)
    discovery = fake("sup-discovery", found("t1", t1), found("none"), provides_topology=True)
    other = fake("sup-reader", found("t2", t2), found("after"))
    inbox = Inbox()
    sup = Supervisor([discovery, other], inbox, topology=t0)

    async def story() -> None:
        await sup.run_once(other)  # a snapshot from a collector that does not discover: ignored
        assert sup.topology is t0
        await sup.run_once(discovery)
        assert sup.topology is t1
        await sup.run_once(discovery)  # a discovery run without a new snapshot keeps the last
        assert sup.topology is t1
        await sup.run_once(other)

    try:
        asyncio.run(story())
    finally:
        sup.close()
    assert other.handed == [t0, t1]
    assert discovery.handed == [t0, t1]


def test_counters_read_only_the_ports_of_the_snapshot_they_are_handed(
    node_a: FixtureNode, tmp_path: Path
) -> None:
    settings = AgentSettings(
        service_url="http://127.0.0.1:1",
        node_name="n0",
        sysfs_root=node_a.root,
        proc_root=tmp_path,
        spool_dir=tmp_path / "spool",
    )
    saved: dict[str, Any] = {}
    ctx = CollectorContext(settings, {}, saved.get)
    topo = TopologyCollector(ctx).collect(None).topology
    assert topo is not None
    without = Topology(gpus=topo.gpus, rnics=tuple(r for r in topo.rnics if r.name != "mlx5_2"))
    counters = CountersCollector(ctx)
    counters.collect(without)  # the baseline
    bump_counter(node_a.root, "mlx5_2", 1, "link_downed", 2)
    bump_counter(node_a.root, "mlx5_0", 1, "link_downed", 2)
    assert [e["device"] for e in counters.collect(without).events] == ["mlx5_0"]


# --- the schedule ----------------------------------------------------------------------------


def test_runs_keep_to_their_ticks_and_a_run_past_its_tick_skips_the_missed_ones(
    clock: Clock,
) -> None:
    starts: list[float] = []

    def lasting(seconds: float) -> Run:
        def run(_: Topology | None) -> Collected:
            starts.append(clock.now)
            clock.advance(seconds)
            return Collected()

        return run

    # Every 10 s. A run of 3 s or 9.5 s leaves the next tick where it was; one of exactly
    # 10 s is followed at once by the next; one of 15 s misses the tick at 1050, and the
    # next run is a whole interval after it ends (not a burst to catch up).
    c = fake("sup-ticks", *(lasting(s) for s in (3, 9.5, 10, 15, 0, 0)), interval_s=10)
    inbox = Inbox()
    sup = Supervisor([c], inbox)

    async def story() -> set[str]:
        running = asyncio.create_task(sup.run())
        try:
            await inbox.until("six runs", 6)
            return {t.get_name() for t in asyncio.all_tasks()}
        finally:
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running

    try:
        tasks = asyncio.run(story())
    finally:
        sup.close()
    assert starts == [1010, 1020, 1030, 1040, 1065, 1075]
    assert "collector-sup-ticks" in tasks  # named in a dump of the agent's tasks
