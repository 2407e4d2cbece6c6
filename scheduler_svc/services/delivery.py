"""Wakes command long-polls and streams as soon as a commit issues commands to their node.

A waiting poll (or a node's command stream, api/commands.py) looks at the store once
when it starts and then only when it is woken; it never re-reads the store on a
timer. Two things wake it:

- `CommandNotifier`, in this replica: a commit here that issued commands calls
  `notify` (store/uow.py runs it right after the commit).
- What the replica learns of other writers' commits:
  - `CommandListener`, on PostgreSQL: one connection per replica LISTENs on the
    channel that every commit issuing commands NOTIFYs with the nodes' names, in
    the same transaction (store/db.py, `publish_command_nodes`), so a command
    committed by any replica wakes the poll held by another. When the connection
    drops it reconnects with backoff, and after each LISTEN it wakes every waiting
    poll once: what was committed while nobody listened is then read from the store.
  - `CommandWatermark`, on SQLite: one thread reads the newest command id once a
    second (one indexed read), and wakes the nodes of the commands issued since
    its last read. SQLite has one writer at a time, so ids grow in commit order
    and every new command is caught, whoever wrote it (a script on the database
    file, the CLI), within a second. Its first read comes before the service
    serves; after a failed read it reads again from scratch and wakes every poll.

While the listener's LISTEN holds (or the watermark's reads succeed), a renewal
skips its look when nothing woke the node (nor every poll) since its previous
look found nothing: the wake-ups are then a complete account of what could have
changed. Losing the connection (a failed read) and connecting again both void
every earlier empty look, so the looks happen again. On SQLite a command
committed outside the service reaches a renewal that skipped its look within a
second, when the watermark wakes the node.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import func, make_url, select
from sqlalchemy.orm import Session, sessionmaker

from scheduler_svc.store import models as m
from scheduler_svc.store.db import COMMANDS_CHANNEL, command_nodes_from_payload

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class StreamSlot:
    """One open command stream; `replaced` once a newer stream of its node took its slot."""

    replaced: bool = False


class StreamSlots:
    """The command streams open on this replica, at most `per_node` per node: the newest
    replaces the oldest. Each stream of a node wakes at every command the node gets and
    reads the store; 1,500 streams of one agent token made that node's decisions take 3 s
    instead of 0.15 s. An agent holds one stream; a reconnect before the old one noticed
    its end holds two for a moment. Event loop thread only."""

    def __init__(self, per_node: int) -> None:
        self.per_node = per_node
        self._open: dict[str, deque[StreamSlot]] = {}

    def open(self, node: str) -> tuple[StreamSlot, int]:
        """A slot for a new stream of `node`, and how many older streams it replaced
        (wake them: each ends at its next turn with reason `replaced`)."""
        slots = self._open.setdefault(node, deque())
        replaced = 0
        while len(slots) >= self.per_node:
            slots.popleft().replaced = True
            replaced += 1
        slot = StreamSlot()
        slots.append(slot)
        return slot, replaced

    def close(self, node: str, slot: StreamSlot) -> None:
        slots = self._open.get(node)
        if slots is None:
            return
        if slot in slots:
            slots.remove(slot)
        if not slots:
            del self._open[node]

    def count(self, node: str) -> int:
        return len(self._open.get(node, ()))


class CommandNotifier:
    """Per node, an event that a commit issuing it commands sets; and what a renewal needs
    to know to skip its look (`unchanged_since_empty`). All its state is the event loop's:
    other threads reach it through the *_threadsafe methods."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: dict[str, asyncio.Event] = {}
        # Whether every commit by any writer reaches this notifier: on PostgreSQL while
        # the listener's LISTEN holds, on SQLite while the watermark's reads succeed.
        self._listening = False
        # Bumped by every wake-up of all and every change of _listening; per node, by
        # each wake-up of that node. A look's stamp is both, taken as it starts.
        self._generation = 0
        self._seq: dict[str, int] = {}
        # node -> the stamp of its last look that found nothing
        self._empty: dict[str, tuple[int, int]] = {}
        # The service is stopping: waiting polls answer at once (see `close`).
        self._closing = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _event(self, node: str) -> asyncio.Event:
        return self._events.setdefault(node, asyncio.Event())

    def reset(self, node: str) -> None:
        """Forget wake-ups from before now: call just before a poll looks at the store.

        A wake-up that came while no poll of the node waited (the echo of a
        delivery, say) would otherwise make the node's next poll look twice. One
        that comes after this is kept for the wait that follows the look.
        """
        event = self._events.get(node)
        if event is not None:
            event.clear()

    @property
    def closing(self) -> bool:
        """The service is stopping: a poll answers what it has at once instead of waiting."""
        return self._closing

    def close(self) -> None:
        """End every waiting poll, now and from here on: call from the event loop's thread
        when the server is told to stop. uvicorn waits for open requests before it stops,
        and 8,192 polls of up to RAILOVER_COMMANDS_WAIT_MAX_S would hold the stop (and a
        rolling restart) that long; answered empty now, each agent polls again at once,
        reaching another replica or this one restarted, and nothing is lost: a command
        stays in the store until a poll takes it."""
        self._closing = True
        for event in self._events.values():
            event.set()

    def close_threadsafe(self) -> None:
        """`close`, from a signal handler or another thread."""
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self.close)

    @property
    def listening(self) -> bool:
        """Whether the listener's LISTEN holds (PostgreSQL) or the watermark reads (SQLite)."""
        return self._listening

    def stamp(self, node: str) -> tuple[int, int]:
        """Taken just before a look at the store: pass it to `looked_empty` after."""
        return self._generation, self._seq.get(node, 0)

    def looked_empty(self, node: str, stamp: tuple[int, int]) -> None:
        """A look that began at `stamp` found nothing for the node. Kept only if no
        wake-up came since it began (one that did may be for what it missed). An older
        empty look is void either way: its stamp is not the node's any more."""
        if stamp == self.stamp(node):
            self._empty[node] = stamp

    def unchanged_since_empty(self, node: str) -> bool:
        """Whether a look now would find what the node's last empty look found: nothing.

        True only while listening (every commit anywhere that issues commands to the node
        reaches `notify`, on SQLite within the watermark's interval), and only if no
        wake-up of the node or of all, and no change of the listener's connection, came
        since that look began. A renewal then skips its look and waits at once; a wake-up
        while it waits ends the wait as usual.
        """
        return self._listening and self._empty.get(node) == self.stamp(node)

    def listening_threadsafe(self, listening: bool) -> None:
        """The listener's LISTEN took effect (True) or its connection was lost (False).
        Either way no earlier empty look counts any more."""
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._set_listening, listening)

    def _set_listening(self, listening: bool) -> None:
        self._listening = listening
        self._generation += 1
        self._empty.clear()

    async def wait(self, node: str, timeout: float) -> None:
        event = self._event(node)
        try:
            # Not wait_for, which on 3.11 can swallow the cancellation of a poll whose
            # client left just as the wait ended (CPython gh-86296).
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return
        finally:
            event.clear()

    def notify(self, nodes: Iterable[str]) -> None:
        """Call from the event loop's own thread."""
        self._notify(list(nodes))

    def notify_threadsafe(self, nodes: Iterable[str]) -> None:
        """Callable from the worker threads that run sync routes."""
        if self._loop is None or self._loop.is_closed():
            return
        names = list(nodes)
        self._loop.call_soon_threadsafe(self._notify, names)

    def notify_all_threadsafe(self) -> None:
        """Wake every waiting poll once (after the listener missed what others committed)."""
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._notify_all)

    def _notify(self, nodes: list[str]) -> None:
        for n in nodes:
            # A new stamp for the node: its last empty look, if any, no longer matches.
            self._seq[n] = self._seq.get(n, 0) + 1
            self._event(n).set()

    def _notify_all(self) -> None:
        self._generation += 1
        self._empty.clear()
        for event in self._events.values():
            event.set()


# The listener's name in pg_stat_activity (operators, and tests that drop its connection).
LISTENER_APPLICATION_NAME = "railover-command-listener"
# How long one wait for notifications lasts: one idle wake-up each. `stop` does not wait
# it out: it NOTIFYs the listener's own channel (the wait's bound only matters when the
# store cannot be reached to send that).
LISTEN_WAIT_S = 1.0
# Idle this long, the listener checks that its connection still answers.
LISTEN_PING_S = 30.0
RECONNECT_FIRST_S = 0.1
RECONNECT_MAX_S = 10.0
# How long the listener waits for a store that takes connections but does not answer
# (libpq's connect_timeout, whole seconds, 2 at least), and how long `stop` waits to
# send its NOTIFY to one: its wait then ends within LISTEN_WAIT_S anyway.
CONNECT_TIMEOUT_S = 10
STOP_CONNECT_TIMEOUT_S = 2


def libpq_url(sqlalchemy_url: str) -> str:
    """The store's URL as libpq takes it (without SQLAlchemy's +driver)."""
    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(False)


class CommandListener:
    """The replica's one LISTEN connection on PostgreSQL, in a thread of its own."""

    def __init__(self, url: str, notifier: CommandNotifier) -> None:
        self._url = libpq_url(url)
        self._notifier = notifier
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # This listener's own channel: `stop` NOTIFYs it to end the wait at once.
        self._stop_channel = f"railover_stop_{uuid.uuid4().hex}"
        # Each time LISTEN took effect: the first connect and every reconnect.
        self.listens = 0

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="railover-command-listener", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._notifier.listening_threadsafe(False)
        if self._thread is None:
            return
        try:
            with psycopg.connect(
                self._url, autocommit=True, connect_timeout=STOP_CONNECT_TIMEOUT_S
            ) as conn:
                conn.execute(f"NOTIFY {self._stop_channel}")
        except psycopg.Error:  # the store is gone: the wait ends within LISTEN_WAIT_S
            pass
        self._thread.join(timeout=10)

    def _run(self) -> None:
        backoff = RECONNECT_FIRST_S
        while not self._stop.is_set():
            try:
                with self._connect() as conn:
                    conn.execute(f"LISTEN {COMMANDS_CHANNEL}")
                    conn.execute(f"LISTEN {self._stop_channel}")
                    self.listens += 1
                    # From here every commit reaches this replica: renewals may skip looks.
                    self._notifier.listening_threadsafe(True)
                    # Commits made while this replica was not listening sent their NOTIFY
                    # to nobody: every waiting poll looks at the store once more.
                    self._notifier.notify_all_threadsafe()
                    backoff = RECONNECT_FIRST_S
                    self._listen(conn)
            except psycopg.Error as exc:
                # What is committed from now on may reach nobody: every renewal looks.
                self._notifier.listening_threadsafe(False)
                if self._stop.is_set():
                    return
                log.warning(
                    "command listener lost PostgreSQL (%s); reconnecting in %.1f s", exc, backoff
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)
            except Exception:  # the listener must outlive anything one connection does
                self._notifier.listening_threadsafe(False)
                log.exception("command listener failed; reconnecting in %.1f s", backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)

    def _connect(self) -> psycopg.Connection[Any]:
        # Keepalives: a peer that vanished without closing (a host down, a cut link) is
        # noticed by the kernel too, not only by the next ping.
        return psycopg.connect(
            self._url,
            autocommit=True,
            application_name=LISTENER_APPLICATION_NAME,
            connect_timeout=CONNECT_TIMEOUT_S,
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
        )

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        idle = 0.0
        while not self._stop.is_set():
            woke = False
            for note in conn.notifies(timeout=LISTEN_WAIT_S):
                if note.channel == self._stop_channel:
                    return
                woke = True
                self._notifier.notify_threadsafe(command_nodes_from_payload(note.payload))
            idle = 0.0 if woke else idle + LISTEN_WAIT_S
            if idle >= LISTEN_PING_S:
                conn.execute("SELECT 1")
                idle = 0.0


# SQLite: how often the watermark reads the newest command id, so the most a command from
# outside the service waits for a poll that skipped its look; and the pause after a failed
# read before it reads again from scratch.
WATERMARK_S = 1.0
WATERMARK_RETRY_S = 5.0


class CommandWatermark:
    """SQLite's stand-in for the listener: the newest command id, read once a second in a
    thread of its own; the nodes of commands newer than the last read are woken."""

    def __init__(
        self,
        reads: sessionmaker[Session],
        notifier: CommandNotifier,
        *,
        interval_s: float = WATERMARK_S,
    ) -> None:
        self._reads = reads
        self._notifier = notifier
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._newest: int | None = None  # None: read from scratch next
        self._failing = False  # the last read failed (logged once per run of failures)
        self.reads = 0  # reads that succeeded, for tests and probes

    def start(self) -> None:
        """Read once here, before the service serves, then once a second in a thread."""
        self._read()
        self._thread = threading.Thread(
            target=self._run, name="railover-command-watermark", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._notifier.listening_threadsafe(False)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(
            self._interval_s if self._newest is not None else WATERMARK_RETRY_S
        ):
            self._read()

    def _read(self) -> None:
        try:
            with self._reads() as session:
                newest = session.scalar(select(func.max(m.Command.command_id))) or 0
                nodes: list[str] = []
                if self._newest is not None and newest > self._newest:
                    nodes = list(
                        session.scalars(
                            select(m.Command.node)
                            .where(
                                m.Command.command_id > self._newest,
                                m.Command.command_id <= newest,
                            )
                            .distinct()
                        )
                    )
        except Exception:  # the watermark must outlive anything one read does
            if not self._failing:
                log.exception(
                    "command watermark: reading the store failed; every poll looks, and the "
                    "watermark reads again in %.0f s",
                    WATERMARK_RETRY_S,
                )
            self._failing = True
            # What is committed from now on may reach nobody: every renewal looks.
            self._newest = None
            self._notifier.listening_threadsafe(False)
            return
        self._failing = False
        self.reads += 1
        if self._newest is None:
            self._newest = newest
            # From here every new command is seen: renewals may skip looks. Polls that
            # began before this read look once more, for what was committed until it.
            self._notifier.listening_threadsafe(True)
            self._notifier.notify_all_threadsafe()
            return
        self._newest = newest
        if nodes:
            self._notifier.notify_threadsafe(nodes)
