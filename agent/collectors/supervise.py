"""Running the collectors: each on its own schedule, in its own thread, under its own timeout.

A sysfs read can block for good (a wedged driver, a hung PCIe device), and a
thread blocked in ``open()`` or ``read()`` cannot be interrupted. So every
collector gets its own worker thread: one that hangs holds back nobody else,
and port-down detection goes on while, say, a counter read is stuck. A run
that overruns ``timeout_s()`` is reported as failed
(``railover_agent_collector_success 0``) and the collector is not started
again until its stuck run returns; when it does, what it found is still
delivered, because the collector has already moved its own state past it.

The topology is handed to each run as the snapshot current when the run
starts. Only results of the collector that ``provides_topology`` replace it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

from agent import metrics
from agent.collectors.base import Collected, Collector
from agent.topology import Topology

log = logging.getLogger(__name__)

Deliver = Callable[[Collector, Collected], None]


class _Worker:
    """One daemon thread that runs one collector's runs, one at a time.

    Daemon, so a run stuck in the kernel does not keep the agent from exiting.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=f"collector-{name}", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def submit(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[[], Collected]
    ) -> asyncio.Future[Collected]:
        fut: asyncio.Future[Collected] = loop.create_future()

        def settle(result: Collected | None, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                assert result is not None
                fut.set_result(result)

        def job() -> None:
            try:
                result = fn()
            except BaseException as exc:  # handed to the loop, which logs it
                outcome: tuple[Collected | None, BaseException | None] = (None, exc)
            else:
                outcome = (result, None)
            # The agent may have stopped (loop closed) while this run was stuck.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, *outcome)

        self._jobs.put(job)
        return fut

    def close(self) -> None:
        self._jobs.put(None)


class Supervisor:
    """Runs ``collectors`` and hands every result to ``deliver`` (on the event loop)."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        deliver: Deliver,
        topology: Topology | None = None,
    ) -> None:
        self.collectors = list(collectors)
        self._deliver = deliver
        # The latest snapshot: replaced by the topology collector's runs, never mutated.
        self.topology = topology
        self._workers = {c.name: _Worker(c.name) for c in self.collectors}
        self._running: dict[str, asyncio.Future[Collected]] = {}
        self._skipping: set[str] = set()  # stuck collectors whose skips were logged
        # Delivering (the spool) failed: a broken host, not a collector's fault. It
        # ends run(), and with it the agent, as any other loop's failure does.
        self._broken: BaseException | None = None

    def close(self) -> None:
        """Lets the worker threads end; a stuck one ends with the process."""
        for w in self._workers.values():
            w.close()

    async def run_once(self, c: Collector) -> None:
        """One run of ``c``, awaited at most ``c.timeout_s()``."""
        if c.name in self._running:
            metrics.COLLECTOR_SUCCESS.labels(c.name).set(0)
            if c.name not in self._skipping:
                self._skipping.add(c.name)
                log.warning(
                    "collector %s is stuck in its last run; skipping it until it returns", c.name
                )
            return
        loop = asyncio.get_running_loop()
        snapshot = self.topology
        start = time.perf_counter()
        fut = self._workers[c.name].submit(loop, lambda: c.collect(snapshot))
        self._running[c.name] = fut
        timeout = c.timeout_s()
        late = False

        def finished(f: asyncio.Future[Collected]) -> None:
            del self._running[c.name]
            self._skipping.discard(c.name)
            took = time.perf_counter() - start
            metrics.COLLECTOR_DURATION.labels(c.name).set(took)
            exc = f.exception()
            if exc is not None:
                log.error("collector %s failed", c.name, exc_info=exc)
                metrics.COLLECTOR_SUCCESS.labels(c.name).set(0)
                return
            if late:
                log.warning("collector %s took %.1fs (timeout %gs)", c.name, took, timeout)
            else:
                metrics.COLLECTOR_SUCCESS.labels(c.name).set(1)
            got = f.result()
            if c.provides_topology and got.topology is not None:
                self.topology = got.topology
            try:
                self._deliver(c, got)
            except Exception as err:
                self._broken = err

        fut.add_done_callback(finished)
        # asyncio.wait, not wait_for: it leaves the run alone on timeout, and (unlike
        # wait_for on 3.11) never swallows a cancellation that races with the result.
        done, _ = await asyncio.wait({fut}, timeout=timeout)
        if not done:
            late = True
            metrics.COLLECTOR_SUCCESS.labels(c.name).set(0)
            log.warning("collector %s has not returned within %gs", c.name, timeout)
            return
        # Let the done callback (scheduled with the result) run before returning.
        await asyncio.sleep(0)
        self._raise_if_broken()

    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise self._broken

    async def first_round(self) -> None:
        """Start-up: discover the topology first, then every other collector at once."""
        for c in self.collectors:
            if c.provides_topology:
                await self.run_once(c)
        await asyncio.gather(
            *(self.run_once(c) for c in self.collectors if not c.provides_topology)
        )

    async def run(self) -> None:
        """Every collector on its own schedule, forever (cancel to stop)."""
        async with asyncio.TaskGroup() as tg:
            for c in self.collectors:
                tg.create_task(self._loop(c), name=f"collector-{c.name}")

    async def _loop(self, c: Collector) -> None:
        interval = c.interval_s()
        next_tick = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
            self._raise_if_broken()  # also what a late run of another collector found
            await self.run_once(c)
            next_tick += interval
            if next_tick < time.monotonic():
                # Fell behind (a slow run, a frozen host); skip missed ticks, do not burst.
                next_tick = time.monotonic() + interval
