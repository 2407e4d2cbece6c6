"""The agent process: poll collectors, report, relay commands, under one task group.

Each loop survives the service being away (timeouts, backoff, log, go on). A
loop that fails for any other reason is a bug or a broken host; the task group
then stops the whole agent cleanly and the supervisor restarts it, with
nothing lost, since everything not yet accepted is in the spool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import httpx

from agent import metrics
from agent.client import (
    SERVER_FAULT_ROUNDS,
    Backoff,
    Rejected,
    ServerFault,
    ServiceClient,
    Unavailable,
)
from agent.collectors.base import Collected, Collector, CollectorContext
from agent.collectors.catalog import REGISTRY
from agent.collectors.names import PLUGIN
from agent.collectors.supervise import Supervisor
from agent.config import AgentSettings
from agent.events import Event
from agent.health import HealthServer
from agent.plugin import ACK_ROUND, PluginHub, PluginLimits, PluginServer, batch_acks
from agent.railmap import load_rail_map
from agent.spool import Spool
from agent.topology import Topology

log = logging.getLogger(__name__)


def plugin_limits(s: AgentSettings) -> PluginLimits:
    return PluginLimits(
        max_communicators=s.plugin_max_communicators,
        max_communicators_per_client=s.plugin_max_communicators_per_client,
        max_acks=s.plugin_max_acks,
        max_clients=s.plugin_max_clients,
        max_clients_per_process=s.plugin_max_clients_per_process,
        hello_timeout_s=s.plugin_hello_timeout_s,
        frame_timeout_s=s.plugin_frame_timeout_s,
    )


class _Stop(Exception):
    """Raised inside the task group to end it on request."""


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.rail_map = load_rail_map(settings.rail_map)
        self.spool = Spool(
            settings.spool_dir,
            settings.spool_max_events,
            max_dead_letters=settings.spool_max_dead_letters,
            max_quarantined=settings.spool_max_quarantined,
        )
        self.ctx = CollectorContext(settings, self.rail_map, self.spool.get_state)
        disabled = set(settings.disabled_collectors)
        self.collectors: list[Collector] = [
            cls(self.ctx) for name, cls in REGISTRY.items() if name not in disabled
        ]
        self.supervisor = Supervisor(self.collectors, self._collected)
        self.plugin_enabled = PLUGIN not in disabled
        for name in disabled:
            # A switched-off collector is neither failing nor succeeding.
            with contextlib.suppress(KeyError):
                metrics.COLLECTOR_SUCCESS.remove(name)
        self.client = ServiceClient(settings, transport)
        metrics.watch_own_process(settings.proc_root)
        self.registered: str | None = None
        self._rejected_topology: str | None = None
        # Server-fault rounds of the batch at the spool's head, by its first seq.
        self._server_fault_rounds: dict[int, int] = {}
        self.last_poll: float | None = None
        self.metrics_port: int | None = None
        # asyncio.Event binds to a loop only when first awaited, so these can
        # be made here and stop() works even before run() has started.
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()
        self.hub: PluginHub | None = None
        self._plugin_server: PluginServer | None = None
        self._health: HealthServer | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    async def wait_ready(self) -> None:
        """Until the first poll and the plugin socket are done (for tests and the demo)."""
        await self._ready.wait()

    async def run(self) -> None:
        s = self.settings
        self._health = HealthServer(s.metrics_host, s.metrics_port, self.health)
        self.metrics_port = self._health.port
        self._health.start()
        try:
            if self.plugin_enabled:
                self.hub = PluginHub(
                    s.node_name, self._spool_events, s.command_hold_s, plugin_limits(s)
                )
                self._plugin_server = PluginServer(s.socket, self.hub, s.socket_mode)
                await self._plugin_server.start()
                metrics.COLLECTOR_SUCCESS.labels(PLUGIN).set(1)
            # Baselines first (port states, counters), so a change after "ready" is an event.
            await self.supervisor.first_round()
            await self._poll_once()
            self._ready.set()
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self.supervisor.run(), name="collectors")
                    tg.create_task(self._poll_loop(), name="poll")
                    tg.create_task(self._report_loop(), name="report")
                    if self.plugin_enabled:
                        tg.create_task(self._command_loop(), name="commands")
                        tg.create_task(self._ack_loop(), name="acks")
                    tg.create_task(self._until_stopped(), name="stop")
            except* _Stop:
                log.info("agent stopping")
        finally:
            await self._shutdown()

    async def _until_stopped(self) -> None:
        await self._stop.wait()
        raise _Stop

    async def _shutdown(self) -> None:
        self.supervisor.close()
        if self.hub is not None:
            # Keep the last progress samples; they are cheap and the next start sends them.
            self._spool_events(self.hub.take_progress())
        if self._plugin_server is not None:
            await self._plugin_server.close()
        await self.client.aclose()
        if self._health is not None:
            self._health.stop()
        self.spool.close()

    def health(self) -> tuple[bool, dict[str, Any]]:
        age = None if self.last_poll is None else time.monotonic() - self.last_poll
        limit = max(5.0, 3 * self.settings.poll_interval_s)
        ok = age is not None and age < limit
        return ok, {
            "last_poll_age_s": age,
            "spool_events": self.spool.depth(),
            "registered": self.registered is not None,
        }

    # -- collecting -----------------------------------------------------------------------------
    def _spool_events(self, events: list[Event], state: dict[str, Any] | None = None) -> None:
        if not events and not state:
            return
        self.spool.put(events, state)
        if events:
            self._wake.set()

    def _collected(self, c: Collector, got: Collected) -> None:
        """A collector's run returned (on the loop): spool what it found at once."""
        self._spool_events(got.events, got.state)
        if got.topology is not None and got.topology.fingerprint() != self.registered:
            self._wake.set()

    async def _poll_once(self) -> None:
        """The agent's own tick: progress from the plugin, expiring commands, liveness."""
        if self.hub is not None:
            self._spool_events(self.hub.take_progress())
            self.hub.deliver_pending()  # expires commands nobody took
        self.last_poll = time.monotonic()

    async def _poll_loop(self) -> None:
        interval = self.settings.poll_interval_s
        next_tick = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
            await self._poll_once()
            next_tick += interval
            if next_tick < time.monotonic():
                # Fell behind (host was frozen); skip missed ticks, do not burst.
                next_tick = time.monotonic() + interval

    # -- reporting ------------------------------------------------------------------------------
    def _registration_payload(self, topo: Topology) -> dict[str, Any]:
        body = topo.payload()
        for g in body["gpus"]:
            # The service's field is a plain bool; unknown means "do not plan NVLink transit".
            g["nvlink"] = bool(g["nvlink"])
        return body

    async def _register_if_needed(self) -> bool:
        topo = self.supervisor.topology
        if topo is None:
            return True
        fp = topo.fingerprint()
        if fp in (self.registered, self._rejected_topology):
            return True
        try:
            await self.client.register(self._registration_payload(topo))
        except Rejected as exc:
            log.error("service refused this node's topology; events still flow: %s", exc)
            self._rejected_topology = fp
            return True
        self.registered = fp
        log.info(
            "registered %d GPUs and %d RNIC ports with the service",
            len(topo.gpus),
            len(topo.rnics),
        )
        return True

    async def _send(self, batch: list[tuple[int, Event]], bisecting: bool = False) -> None:
        """Send a batch; find and set aside events the service refuses one by one.

        A batch the service keeps failing on (500) is retried SERVER_FAULT_ROUNDS
        rounds with the loop's backoff, then halved until the event at fault is
        alone; that one gets its own rounds and is then dead-lettered, so the
        events behind it (later faults of this node) still arrive.
        """
        try:
            accepted, duplicates = await self.client.post_events([ev for _, ev in batch])
        except ServerFault as exc:
            if not bisecting:
                head = batch[0][0]
                rounds = self._server_fault_rounds.get(head, 0) + 1
                if rounds < SERVER_FAULT_ROUNDS:
                    self._server_fault_rounds = {head: rounds}
                    raise  # the loop backs off and sends the same head again
                self._server_fault_rounds = {}
                if len(batch) == 1:
                    self._dead_letter_fault(batch[0], exc, rounds)
                    return
            if len(batch) > 1:
                mid = len(batch) // 2
                await self._send(batch[:mid], bisecting=True)
                await self._send(batch[mid:], bisecting=True)
                return
            await self._send_alone(batch[0], exc)
            return
        except Rejected as exc:
            # A 404 most likely means our node is unknown (the service lost its
            # store): re-register once, then treat it as a refusal.
            if exc.status == 404 and self.registered is not None:
                self.registered = None
                raise Unavailable(str(exc), exc.status) from exc
            if len(batch) == 1:
                seq, ev = batch[0]
                self.spool.dead_letter(seq, ev, str(exc))
                return
            mid = len(batch) // 2
            await self._send(batch[:mid], bisecting)
            await self._send(batch[mid:], bisecting)
            return
        self._server_fault_rounds = {}
        self.spool.remove([seq for seq, _ in batch])
        metrics.EVENTS_SENT.inc(len(batch))
        metrics.EVENTS_DUPLICATE.inc(duplicates)
        log.debug("sent %d events (%d new, %d duplicates)", len(batch), accepted, duplicates)

    async def _send_alone(self, item: tuple[int, Event], exc: ServerFault) -> None:
        """One event found while bisecting: its own rounds, then the dead letter."""
        seq, ev = item
        for rounds in range(1, SERVER_FAULT_ROUNDS):
            await asyncio.sleep(min(2.0, 0.2 * 2**rounds))
            try:
                await self.client.post_events([ev])
            except ServerFault as again:
                exc = again
                continue
            except Rejected as refused:
                self.spool.dead_letter(seq, ev, str(refused))
                return
            self.spool.remove([seq])
            metrics.EVENTS_SENT.inc()
            return
        self._dead_letter_fault(item, exc, SERVER_FAULT_ROUNDS)

    def _dead_letter_fault(self, item: tuple[int, Event], exc: ServerFault, rounds: int) -> None:
        seq, ev = item
        self.spool.dead_letter(seq, ev, f"{exc} (after {rounds} rounds)", cause="server_error")

    async def _report_loop(self) -> None:
        backoff = Backoff(0.2, self.settings.retry_max_backoff_s)
        while True:
            try:
                await self._register_if_needed()
                # Clear before looking, so an event spooled between the look
                # and the wait still wakes us.
                self._wake.clear()
                batch = self.spool.peek(self.settings.batch_max, sending=True)
                if not batch:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                    # cancellation that lands as the wait ends (CPython gh-86296), and
                    # then stop() never ends this loop.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(5.0):
                            await self._wake.wait()
                    continue
                await self._send(batch)
                backoff.reset()
            except Unavailable as exc:
                delay = backoff.next()
                log.warning("service unavailable (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)

    # -- commands -------------------------------------------------------------------------------
    async def _command_loop(self) -> None:
        hub = self.hub
        assert hub is not None
        backoff = Backoff(0.5, self.settings.retry_max_backoff_s)
        stream = self.settings.command_stream
        # The service hands each command out once; after a restart this agent
        # asks once for those delivered to its predecessor but never acknowledged.
        first = True
        while True:
            try:
                if stream:
                    ended = await self._stream_commands(hub, backoff)
                    if ended in ("max_age", "stopping"):
                        # An end the service chose: open the next stream at once (after a
                        # stop, most likely on another replica).
                        continue
                    raise Unavailable(f"command stream ended: {ended or 'without an end event'}")
                cmds = await self.client.fetch_commands(
                    self.settings.command_wait_s, include_unacked=first
                )
                first = False
            except (Unavailable, Rejected) as exc:
                if stream and isinstance(exc, Rejected) and exc.status in (404, 405):
                    # A service from before the stream: long-poll it instead, from here on.
                    log.warning("the service has no command stream (%s); long-polling", exc)
                    stream = False
                    continue
                delay = backoff.next()
                log.warning("fetching commands failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            fresh = [hub.on_command(c) for c in cmds]
            if cmds and not any(fresh):
                # Only commands still waiting for a client: the service will
                # keep returning them at once, so do not spin.
                await asyncio.sleep(self.settings.poll_interval_s)

    async def _stream_commands(self, hub: PluginHub, backoff: Backoff) -> str | None:
        """Relay one command stream to the plugin hub; its end's reason, None if it broke.

        Each stream asks for the commands delivered but not acknowledged: one sent into a
        stream that broke reached the store's "delivered", not this agent. The hub knows
        the commands it has, so one it is sent again is not relayed twice.
        """
        async for event, data in self.client.stream_commands(
            self.settings.command_heartbeat_s, include_unacked=True
        ):
            if event == "command":
                hub.on_command(data)
            elif event == "end":
                reason = data.get("reason")
                return str(reason) if reason is not None else None
            elif event == "ready":
                # Open: a break from here on backs off from the start again.
                backoff.reset()
                log.debug("command stream open: %s", data)
        return None

    async def _ack_loop(self) -> None:
        """Send the ranks' acks, those that say the same thing together (one request a node)."""
        hub = self.hub
        assert hub is not None
        backoff = Backoff(0.2, self.settings.retry_max_backoff_s)
        while True:
            reqs = [await hub.acks.get()]
            while not hub.acks.empty() and len(reqs) < ACK_ROUND:
                reqs.append(hub.acks.get_nowait())
            batches = batch_acks(reqs)
            for i, batch in enumerate(batches):
                try:
                    await self.client.ack(
                        batch.command_id, batch.status, batch.ranks, batch.detail, batch.ops_done
                    )
                    backoff.reset()
                except Rejected as exc:
                    log.warning(
                        "service refused ack %s for command %d: %s",
                        batch.status,
                        batch.command_id,
                        exc,
                    )
                except Unavailable as exc:
                    delay = backoff.next()
                    log.warning(
                        "ack for command %d failed (%s); retrying in %.1fs",
                        batch.command_id,
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    # This one and those after it go again, in their order, ahead of newer acks.
                    retry = [r for b in batches[i:] for r in b.members]
                    for r in retry:
                        r.attempts += 1
                    newer = []
                    while not hub.acks.empty():
                        newer.append(hub.acks.get_nowait())
                    for r in retry + newer:
                        hub.acks.put_nowait(r)
                    break
