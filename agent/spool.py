"""The on-disk spool: events wait here until the service has accepted them.

SQLite in WAL mode in SPOOL_DIR. An event is written once, with its id, and is
deleted only after the service answered 202 for a batch containing it; a crash
between the two resends it with the same id, which the service deduplicates.

The spool is bounded. When full, the oldest droppable samples (progress) go
first; a fault event is never dropped to make room. If only faults are left
and the bound is reached, a new fault is still refused rather than growing
without limit, but loudly: an ERROR log line and
``railover_agent_events_dropped_total{reason="spool_full"}``.

The same file keeps small collector state (last port states, counter values)
so a restarted agent neither re-reports nor misses a change.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agent import metrics
from agent.events import DROPPABLE_KINDS, Event

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    droppable INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_droppable ON events (droppable, seq);
CREATE TABLE IF NOT EXISTS dead_letter (
    event_id TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    reason TEXT NOT NULL,
    at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE IF NOT EXISTS state (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


class Spool:
    def __init__(self, directory: Path, max_events: int) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        # Two agents draining one spool would each send what the other is
        # sending; the lock makes the second one refuse to start instead.
        self._lock = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise RuntimeError(f"another agent is using the spool in {directory}") from None
        self.path = directory / "spool.sqlite3"
        self.max_events = max_events
        # isolation_level=None: we open transactions ourselves, one per call.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a process crash (the case that matters
        # for an agent); only a power cut can lose the last commits.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._depth = self._count()
        metrics.SPOOL_EVENTS.set(self._depth)

    def close(self) -> None:
        self._db.close()
        os.close(self._lock)  # releases the flock

    def _count(self) -> int:
        row = self._db.execute("SELECT COUNT(*) FROM events").fetchone()
        return int(row[0])

    def depth(self) -> int:
        return self._depth

    def put(self, events: Iterable[Event], state: dict[str, Any] | None = None) -> int:
        """Store events (and collector state, atomically with them).

        Returns how many events were stored; refusals are logged and counted.
        """
        stored = 0
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for key, value in (state or {}).items():
                self._set_state(key, value)
            for ev in events:
                droppable = ev["kind"] in DROPPABLE_KINDS
                if self._depth >= self.max_events and not self._make_room(droppable, ev):
                    continue
                cur = self._db.execute(
                    "INSERT OR IGNORE INTO events (event_id, kind, droppable, body) "
                    "VALUES (?, ?, ?, ?)",
                    (ev["event_id"], ev["kind"], int(droppable), json.dumps(ev)),
                )
                if cur.rowcount:
                    self._depth += 1
                    stored += 1
                    metrics.EVENTS_SPOOLED.labels(ev["kind"]).inc()
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            self._depth = self._count()
            raise
        metrics.SPOOL_EVENTS.set(self._depth)
        return stored

    def _make_room(self, droppable: bool, ev: Event) -> bool:
        row = self._db.execute(
            "SELECT seq, kind FROM events WHERE droppable = 1 ORDER BY seq LIMIT 1"
        ).fetchone()
        if row is not None:
            self._db.execute("DELETE FROM events WHERE seq = ?", (row[0],))
            self._depth -= 1
            metrics.EVENTS_DROPPED.labels(row[1], "spool_full").inc()
            return True
        metrics.EVENTS_DROPPED.labels(ev["kind"], "spool_full").inc()
        if droppable:
            log.warning("spool full of fault events; dropping new %s sample", ev["kind"])
        else:
            log.error(
                "SPOOL FULL (%d fault events waiting for the service): refusing %s event %s "
                "for %s; raise RAILOVER_AGENT_SPOOL_MAX_EVENTS or restore the service link",
                self._depth,
                ev["kind"],
                ev["event_id"],
                ev.get("device", "-"),
            )
        return False

    def peek(self, limit: int) -> list[tuple[int, Event]]:
        """The oldest ``limit`` events, in the order they were created."""
        rows = self._db.execute(
            "SELECT seq, body FROM events ORDER BY seq LIMIT ?", (limit,)
        ).fetchall()
        return [(int(seq), json.loads(body)) for seq, body in rows]

    def remove(self, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        self._db.execute("BEGIN IMMEDIATE")
        self._db.executemany("DELETE FROM events WHERE seq = ?", [(s,) for s in seqs])
        self._db.execute("COMMIT")
        self._depth = self._count()
        metrics.SPOOL_EVENTS.set(self._depth)

    def dead_letter(self, seq: int, ev: Event, reason: str, cause: str = "rejected") -> None:
        """Set aside an event the service refuses outright (cause "rejected") or keeps
        failing on ("server_error"), so it cannot block the rest."""
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute(
            "INSERT OR REPLACE INTO dead_letter (event_id, body, reason) VALUES (?, ?, ?)",
            (ev["event_id"], json.dumps(ev), reason[:2000]),
        )
        self._db.execute("DELETE FROM events WHERE seq = ?", (seq,))
        self._db.execute("COMMIT")
        self._depth = self._count()
        metrics.SPOOL_EVENTS.set(self._depth)
        metrics.EVENTS_DROPPED.labels(ev["kind"], cause).inc()
        verb = "rejected" if cause == "rejected" else "keeps failing on"
        log.error(
            "dead-lettered event %s (%s, device %s): the service %s it: %s",
            ev["event_id"],
            ev["kind"],
            ev.get("device", "-"),
            verb,
            reason,
        )

    def dead_letters(self) -> list[tuple[Event, str]]:
        rows = self._db.execute("SELECT body, reason FROM dead_letter ORDER BY at").fetchall()
        return [(json.loads(b), r) for b, r in rows]

    def get_state(self, key: str) -> Any:
        row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def set_state(self, key: str, value: Any) -> None:
        self._set_state(key, value)

    def _set_state(self, key: str, value: Any) -> None:
        self._db.execute(
            "INSERT INTO state (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, json.dumps(value)),
        )
