"""The on-disk spool: events wait here until the service has accepted them.

SQLite in WAL mode in SPOOL_DIR. An event is written once, with its id, and is
deleted only after the service answered 202 for a batch containing it; a crash
between the two resends it with the same id, which the service deduplicates.

Events leave in lanes (``agent.events.LANES``): port and device state first, then the
other faults and evidence, progress samples last; in the order they happened within a
lane. No amount of CQE noise or progress waiting ahead of it delays a port going down.

The spool is bounded. When full, room is made in this order, so a fault is never
refused while the spool holds anything less important:

1. the oldest droppable sample (progress) goes;
2. a coalescible event (CQE error, counter rise, stall) joins the row already waiting
   for the same component, which then stands for both (``detail.coalesced``);
3. rows waiting for one component are folded into one (all of them, in one pass);
4. for a state or fault event, the oldest coalescible row goes.

Only when none of these frees a row is a new event refused, loudly: an ERROR log line
and ``railover_agent_events_dropped_total{reason="spool_full"}``.

A row that cannot be read back (not JSON, not an event) is moved to the ``quarantine``
table, counted and logged, and the rest flows; a spool file SQLite cannot open is moved
aside and a fresh one made, with an ERROR line. Neither stops the agent. The dead
letters and the quarantine are bounded too (the oldest go).

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent import metrics
from agent.events import (
    DROPPABLE_KINDS,
    KINDS,
    LANES,
    Event,
    coalesce,
    coalesce_key,
    lane_of,
)
from agent.logsafe import Every, printable

log = logging.getLogger(__name__)
# A flood of port events into a spool full of noise evicts one row each: one line per 10 s.
_evicted_log = Every(log)

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
CREATE TABLE IF NOT EXISTS quarantine (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    seq INTEGER NOT NULL,
    body BLOB,
    reason TEXT NOT NULL,
    at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE IF NOT EXISTS state (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""
# Added after the first release: a spool written by an older agent gains them at open
# (its rows all in the fault lane, none coalescible: they leave as they would have).
_COLUMNS = (
    ("lane", "INTEGER NOT NULL DEFAULT 1"),
    ("ckey", "TEXT"),
)
_INDEXES = """
CREATE INDEX IF NOT EXISTS events_lane ON events (lane, seq);
CREATE INDEX IF NOT EXISTS events_ckey ON events (ckey, seq) WHERE ckey IS NOT NULL;
"""

FILE = "spool.sqlite3"


class Spool:
    def __init__(
        self,
        directory: Path,
        max_events: int,
        max_dead_letters: int = 10_000,
        max_quarantined: int = 1_000,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        # Two agents draining one spool would each send what the other is
        # sending; the lock makes the second one refuse to start instead.
        self._lock = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise RuntimeError(f"another agent is using the spool in {directory}") from None
        self.path = directory / FILE
        self.max_events = max_events
        self.max_dead_letters = max_dead_letters
        self.max_quarantined = max_quarantined
        # Rows of the batch last peeked (being sent): never folded into, never the one
        # evicted, so what the service accepts is what is then deleted.
        self._inflight: set[int] = set()
        # Coalescible rows stored since the last fold: none, and a fold would find nothing.
        self._unfolded = 0
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as exc:
            self._db = self._replace_corrupt(exc)
        self._depth = self._count()
        metrics.SPOOL_EVENTS.set(self._depth)

    def _open(self) -> sqlite3.Connection:
        # isolation_level=None: we open transactions ourselves, one per call.
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives a process crash (the case that matters
            # for an agent); only a power cut can lose the last commits.
            db.execute("PRAGMA synchronous=NORMAL")
            check = db.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check[0] if check else 'no answer'}")
            db.executescript(_SCHEMA)
            have = {row[1] for row in db.execute("PRAGMA table_info(events)")}
            for name, decl in _COLUMNS:
                if name not in have:
                    db.execute(f"ALTER TABLE events ADD COLUMN {name} {decl}")
                    if name == "lane":
                        db.executemany(
                            "UPDATE events SET lane = ? WHERE kind = ?",
                            [(lane, kind) for kind, lane in LANES.items()],
                        )
            db.executescript(_INDEXES)
        except BaseException:
            db.close()
            raise
        return db

    def _replace_corrupt(self, exc: sqlite3.DatabaseError) -> sqlite3.Connection:
        """Move a spool file SQLite cannot use aside (with its WAL) and start an empty one."""
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        aside = self.path.with_name(f"{FILE}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            src = self.path.with_name(FILE + suffix)
            if src.exists():
                src.rename(aside.with_name(aside.name + suffix))
        metrics.SPOOL_RESETS.inc()
        log.error(
            "SPOOL FILE CORRUPT (%s): moved it aside to %s and started an empty spool; "
            "events waiting in it are not sent (inspect it with sqlite3)",
            printable(str(exc)),
            aside,
        )
        return self._open()

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

        Returns how many events were stored (an event folded into a waiting row of its
        component counts); refusals are logged and counted.
        """
        stored = 0
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for key, value in (state or {}).items():
                self._set_state(key, value)
            for ev in events:
                droppable = ev["kind"] in DROPPABLE_KINDS
                ckey = coalesce_key(ev)
                if self._depth >= self.max_events:
                    room = self._make_room(droppable, ckey, ev)
                    if room == "folded":
                        stored += 1
                        metrics.EVENTS_SPOOLED.labels(ev["kind"]).inc()
                        continue
                    if room == "refused":
                        continue
                cur = self._db.execute(
                    "INSERT OR IGNORE INTO events (event_id, kind, droppable, body, lane, ckey) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        ev["event_id"],
                        ev["kind"],
                        int(droppable),
                        json.dumps(ev),
                        lane_of(ev["kind"]),
                        ckey,
                    ),
                )
                if cur.rowcount:
                    self._depth += 1
                    stored += 1
                    if ckey is not None:
                        self._unfolded += 1
                    metrics.EVENTS_SPOOLED.labels(ev["kind"]).inc()
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            self._depth = self._count()
            raise
        metrics.SPOOL_EVENTS.set(self._depth)
        return stored

    def _make_room(self, droppable: bool, ckey: str | None, ev: Event) -> str:
        """'room' (a row was freed), 'folded' (ev joined a waiting row) or 'refused'."""
        row = self._db.execute(
            "SELECT seq, kind FROM events WHERE droppable = 1 ORDER BY seq LIMIT 1"
        ).fetchone()
        if row is not None:
            self._db.execute("DELETE FROM events WHERE seq = ?", (row[0],))
            self._depth -= 1
            metrics.EVENTS_DROPPED.labels(row[1], "spool_full").inc()
            return "room"
        if ckey is not None and self._fold_into(ckey, ev):
            return "folded"
        if self._unfolded and self._fold_all():
            return "room"
        if not droppable and ckey is None and self._evict_noise(ev):
            return "room"
        metrics.EVENTS_DROPPED.labels(ev["kind"], "spool_full").inc()
        if droppable:
            log.warning("spool full of fault events; dropping new %s sample", ev["kind"])
        elif ckey is not None:
            log.warning(
                "spool full; dropping new %s of %s: nothing of its component waits to fold into",
                ev["kind"],
                printable(ev.get("device", "-")),
            )
        else:
            log.error(
                "SPOOL FULL (%d fault events waiting for the service): refusing %s event %s "
                "for %s; raise RAILOVER_AGENT_SPOOL_MAX_EVENTS or restore the service link",
                self._depth,
                ev["kind"],
                ev["event_id"],
                printable(ev.get("device", "-")),
            )
        return "refused"

    def _fold_into(self, ckey: str, ev: Event) -> bool:
        """Fold ev into the newest waiting row of its component that is not being sent."""
        rows = self._db.execute(
            "SELECT seq, body FROM events WHERE ckey = ? ORDER BY seq DESC LIMIT ?",
            (ckey, len(self._inflight) + 1),
        ).fetchall()
        for seq, body in rows:
            older, _ = _parse(body)
            if seq in self._inflight or older is None:
                continue  # a bad row is peek's to quarantine
            merged = coalesce(older, ev)
            self._db.execute("UPDATE events SET body = ? WHERE seq = ?", (json.dumps(merged), seq))
            metrics.EVENTS_COALESCED.labels(ev["kind"]).inc()
            return True
        return False

    def _fold_all(self) -> bool:
        """Fold every component's waiting rows into its oldest one; True if a row was freed."""
        self._unfolded = 0
        rows = self._db.execute(
            "SELECT seq, ckey, body FROM events WHERE ckey IN "
            "(SELECT ckey FROM events WHERE ckey IS NOT NULL GROUP BY ckey HAVING COUNT(*) > 1) "
            "ORDER BY seq"
        ).fetchall()
        first: dict[str, tuple[int, Event]] = {}
        gone: list[tuple[int]] = []
        for seq, ckey, body in rows:
            ev, _ = _parse(body)
            if seq in self._inflight or ev is None:
                continue
            if ckey not in first:
                first[ckey] = (seq, ev)
                continue
            keep_seq, kept = first[ckey]
            first[ckey] = (keep_seq, coalesce(kept, ev))
            gone.append((seq,))
            metrics.EVENTS_COALESCED.labels(ev["kind"]).inc()
        if not gone:
            return False
        self._db.executemany(
            "UPDATE events SET body = ? WHERE seq = ?",
            [(json.dumps(ev), seq) for seq, ev in first.values()],
        )
        self._db.executemany("DELETE FROM events WHERE seq = ?", gone)
        self._depth -= len(gone)
        log.warning(
            "spool full: folded %d events into the %d components they are about",
            len(gone) + len(first),
            len(first),
        )
        return True

    def _evict_noise(self, ev: Event) -> bool:
        """Make room for a state or fault event by dropping the oldest coalescible row."""
        rows = self._db.execute(
            "SELECT seq, kind FROM events WHERE ckey IS NOT NULL ORDER BY seq LIMIT ?",
            (len(self._inflight) + 1,),
        ).fetchall()
        for seq, kind in rows:
            if seq in self._inflight:
                continue
            self._db.execute("DELETE FROM events WHERE seq = ?", (seq,))
            self._depth -= 1
            metrics.EVENTS_DROPPED.labels(kind, "spool_full").inc()
            _evicted_log.log(
                logging.WARNING,
                "spool full: dropped the oldest waiting %s to keep %s event %s",
                kind,
                ev["kind"],
                ev["event_id"],
            )
            return True
        return False

    def peek(self, limit: int, *, sending: bool = False) -> list[tuple[int, Event]]:
        """The next ``limit`` events to send: the most urgent lane first, in each lane the
        oldest first. ``sending``: they are on their way (until removed, dead-lettered or
        the next such peek), so a full spool neither folds into nor evicts them.

        A row that is not an event is quarantined on the way (and not returned).
        """
        while True:
            rows = self._db.execute(
                "SELECT seq, CAST(body AS BLOB) FROM events ORDER BY lane, seq LIMIT ?",
                (limit,),
            ).fetchall()
            out: list[tuple[int, Event]] = []
            bad: list[tuple[int, bytes, str]] = []
            for seq, body in rows:
                ev, why = _parse(body)
                if ev is None:
                    bad.append((int(seq), body, why))
                else:
                    out.append((int(seq), ev))
            if bad:
                self._quarantine(bad)
                if not out:
                    continue  # only bad rows at the head: look again
            if sending:
                self._inflight = {seq for seq, _ in out}
            return out

    def _quarantine(self, bad: list[tuple[int, bytes, str]]) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany(
                "INSERT INTO quarantine (seq, body, reason) VALUES (?, ?, ?)",
                [(seq, body, why) for seq, body, why in bad],
            )
            self._db.executemany("DELETE FROM events WHERE seq = ?", [(s,) for s, _, _ in bad])
            self._trim("quarantine", "id DESC", self.max_quarantined)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._depth = self._count()
        metrics.SPOOL_EVENTS.set(self._depth)
        for seq, body, why in bad:
            metrics.SPOOL_QUARANTINED.inc()
            log.error(
                "quarantined spool row %d (%s): %s; it stays in the quarantine table of %s",
                seq,
                why,
                printable(body[:200].decode("utf-8", "replace")),
                self.path,
            )

    def quarantined(self) -> list[tuple[int, bytes, str]]:
        rows = self._db.execute(
            "SELECT seq, CAST(body AS BLOB), reason FROM quarantine ORDER BY id"
        ).fetchall()
        return [(int(seq), bytes(body or b""), str(reason)) for seq, body, reason in rows]

    def _trim(self, table: str, newest_first: str, keep: int) -> None:
        """Delete the oldest rows of `table` beyond `keep` (inside the caller's transaction)."""
        self._db.execute(
            f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "  # noqa: S608  # our own names
            f"ORDER BY {newest_first} LIMIT -1 OFFSET ?)",
            (keep,),
        )

    def remove(self, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        self._db.execute("BEGIN IMMEDIATE")
        self._db.executemany("DELETE FROM events WHERE seq = ?", [(s,) for s in seqs])
        self._db.execute("COMMIT")
        self._inflight.difference_update(seqs)
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
        self._trim("dead_letter", "at DESC, rowid DESC", self.max_dead_letters)
        self._db.execute("COMMIT")
        self._inflight.discard(seq)
        self._depth = self._count()
        metrics.SPOOL_EVENTS.set(self._depth)
        metrics.EVENTS_DROPPED.labels(ev["kind"], cause).inc()
        verb = "rejected" if cause == "rejected" else "keeps failing on"
        log.error(
            "dead-lettered event %s (%s, device %s): the service %s it: %s",
            printable(ev["event_id"]),
            ev["kind"],
            printable(ev.get("device", "-")),
            verb,
            printable(reason, limit=10_000),
        )

    def dead_letters(self) -> list[tuple[Event, str]]:
        rows = self._db.execute(
            "SELECT body, reason FROM dead_letter ORDER BY at, rowid"
        ).fetchall()
        return [(json.loads(b), r) for b, r in rows]

    def get_state(self, key: str) -> Any:
        row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        try:
            return json.loads(row[0])
        except ValueError as exc:
            # A collector starts without its baseline (it reads one afresh) rather than
            # the agent not starting at all.
            log.error("spool state %r is not JSON (%s); dropped", key, exc)
            self._db.execute("DELETE FROM state WHERE key = ?", (key,))
            return None

    def set_state(self, key: str, value: Any) -> None:
        self._set_state(key, value)

    def _set_state(self, key: str, value: Any) -> None:
        self._db.execute(
            "INSERT INTO state (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, json.dumps(value)),
        )


def _parse(body: bytes | str | None) -> tuple[Event | None, str]:
    """The event a row holds, or None and why it is not one."""
    try:
        ev = json.loads(body or b"")
    except ValueError as exc:
        return None, f"not JSON: {exc}"
    if not isinstance(ev, dict):
        return None, f"not an object but {type(ev).__name__}"
    if not isinstance(ev.get("event_id"), str) or not ev["event_id"]:
        return None, "no event_id"
    if ev.get("kind") not in KINDS:
        return None, f"unknown kind {printable(str(ev.get('kind')))}"
    return ev, ""
