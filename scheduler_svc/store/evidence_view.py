"""The fabric's evidence held in memory, per engine, and checked against the store at every
read (issue 33).

The evidence (`services.fabric.evidence`) is four reads: the open faults with the level of
the port each names, the open quarantine flags, the open switch failures and the maintenance
windows not yet done. A report read all four twice (its own transaction, then the pass), and
built a value for every open fault each time, though one node's rows had changed.

Here a replica keeps what it last read, and the store keeps one number, `evidence_stamp`,
that every commit which wrote one of those tables adds one to. A read asks the number
first (one row by its key):

- the same as the one the view was read or kept at: the view holds, but for the nodes
  whose faults or port levels a commit of this process changed since (`stale`, read again
  now, those nodes only) and for what this transaction itself wrote and has not committed
  (read from the store, and not kept);
- another: another replica, another process or a writer this process could not follow
  committed meanwhile; everything is read again and kept at that number.

So a replica never decides on evidence older than the newest commit the store had when the
read began: what it holds is used only while the store says nothing else was committed.

How a commit is followed: every statement sent to the store passes `_sent`, which tells
the writes to the evidence's tables by their SQL and notes, on the connection, which nodes
they touched (by a `node` parameter, or a fault's id the view knows the node of; any other
write to faults or port levels counts as every node). Just before that connection commits,
`_committing` adds one to the stamp, in the same transaction: the last statement before
the COMMIT, so a PostgreSQL writer waiting on the stamp's row lock holds no lock the
stamp's holder waits for. Once the connection is back in the pool (or begins its next
transaction), the view takes the commit in: when it was at the number just before it,
the nodes noted become stale; otherwise it is dropped and read whole at the next read.
A commit that fails is rolled back and taken in by nobody.
"""

from __future__ import annotations

import re
import secrets
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine, Row, event, select, text
from sqlalchemy.engine.interfaces import ExecutionContext
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m
from scheduler_svc.store import plain
from scheduler_svc.store.faults import OpenFault

T = TypeVar("T")
FAULTS, FLAGS, SWITCHES, WINDOWS = "faults", "flags", "switches", "windows"
# The tables the evidence reads, and which of its parts each one's rows are. A port's level
# (rnics.state) is read beside the fault on it, so it is a part of the faults'.
TABLE_PART = {
    "faults": FAULTS,
    "rnics": FAULTS,
    "maintenance_flags": FLAGS,
    "switch_faults": SWITCHES,
    "maintenance_windows": WINDOWS,
}
_WRITES = re.compile(r'\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)', re.IGNORECASE)
# Parameters that name the node a write to faults or rnics is on.
_NODE_PARAMS = ("node", "of_node")
_FAULT_ID_PARAM = "faults_id"  # the ORM's UPDATE of a fault by its key

_CHANGES = "railover_evidence_changes"  # connection info: what the open transaction wrote
_COMMITTED = "railover_evidence_committed"  # ... and, committing, the stamp it took

_STAMP = select(m.EvidenceStamp.version).where(m.EvidenceStamp.id == 1)
# One more, or, where the row is gone (a store emptied by hand or by a test), a new row at a
# random number: a view kept at a number before the row went must not match it by chance.
_BUMP = text(
    "INSERT INTO evidence_stamp (id, version) VALUES (1, :fresh) "
    "ON CONFLICT (id) DO UPDATE SET version = evidence_stamp.version + 1 RETURNING version"
)


@dataclass
class Changes:
    """What a transaction wrote to the evidence's tables: the nodes whose faults or port
    levels changed (or `every_node`), and the other parts changed."""

    nodes: set[str] = field(default_factory=set)
    every_node: bool = False
    parts: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class EvidenceRows:
    """The evidence as the store holds it: the open faults (`FaultRepo.OpenFault`, in id
    order), then the rows of the open flags, the open switch failures and the windows not
    yet done, each in id order."""

    faults: list[OpenFault]
    flags: list[Row[Any]]
    switches: list[Row[Any]]
    windows: list[Row[Any]]


class StoreReads(Protocol):
    """The evidence's reads from the store: the open faults at their ports' levels on some
    nodes (None: all), in id order; one other part whole."""

    def faults(self, nodes: list[str] | None) -> list[OpenFault]: ...

    def part(self, part: str) -> list[Row[Any]]: ...


class EvidenceView:
    """One engine's evidence as last read, at a stamp (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.version: int | None = None
        self._faults: dict[str, tuple[OpenFault, ...]] = {}  # node -> its open faults
        self._node_of: dict[int, str] = {}  # open fault id -> its node
        self._stale: set[str] = set()
        # fault id -> (the value handed out, what a caller built from it): `built`
        self._built: dict[int, tuple[OpenFault, Any]] = {}
        self._parts: dict[str, list[Row[Any]] | None] = {FLAGS: None, SWITCHES: None, WINDOWS: None}

    # --- what commits tell it -----------------------------------------------------------

    def node_of(self, fault_id: int) -> str | None:
        """The node of an open fault held here and current (not stale), else None."""
        with self._lock:
            node = self._node_of.get(fault_id)
            return None if node is None or node in self._stale else node

    def committed(self, version: int, changes: Changes) -> None:
        """A commit of this process took the stamp to `version`, writing `changes`."""
        with self._lock:
            if self.version == version:
                return  # a read after the commit has already kept the view at it
            if self.version != version - 1 or changes.every_node:
                self._drop()
                return
            self.version = version
            self._stale |= changes.nodes
            for part in changes.parts:
                self._parts[part] = None

    def built(self, f: OpenFault, make: Callable[[OpenFault], T]) -> T:
        """`make(f)` for a fault this view handed out, made once while the view hands out
        that same value (the engine's form of an open fault: services/fabric.py)."""
        hit = self._built.get(f.id)
        if hit is not None and hit[0] is f:
            made: T = hit[1]
            return made
        made = make(f)
        with self._lock:
            if self._node_of.get(f.id) is not None:  # still held: the value is kept
                self._built[f.id] = (f, made)
        return made

    def _drop(self) -> None:
        self.version = None
        self._faults, self._node_of, self._stale, self._built = {}, {}, set(), {}
        self._parts = dict.fromkeys(self._parts)

    # --- reads --------------------------------------------------------------------------

    def read(self, session: Session, wanted: set[str] | None, *, repos: StoreReads) -> EvidenceRows:
        """The evidence on `wanted` nodes (every node when None), as of the stamp read now
        and this transaction's own writes. `repos` reads the store."""
        # The stamp's read flushes first: what this transaction wrote is then all sent.
        version = plain.execute(session, _STAMP).scalar()
        own: Changes | None = session.connection().info.get(_CHANGES)
        if version is None:  # no stamp (the store was emptied): nothing can be kept
            return self._read_whole(None, wanted, own, repos)
        with self._lock:
            held = self.version == version
            if held:
                faults = dict(self._faults)
                stale = set(self._stale)
                parts = dict(self._parts)
        if not held:
            return self._read_whole(version, wanted, own, repos)
        # Nodes to read from the store: stale here, or written by this transaction.
        if own is not None and own.every_node:
            fresh = None  # every node
        else:
            fresh = stale | (own.nodes if own is not None else set())
            if wanted is not None:
                fresh &= wanted
        if fresh is None or fresh:
            by_node = _by_node(repos.faults(None if fresh is None else sorted(fresh)))
            read_nodes = fresh
            if read_nodes is not None and own is None:  # committed state only: keep it
                self._keep_nodes(version, read_nodes, by_node)
            if read_nodes is None:
                faults = by_node
            else:
                for n in read_nodes:
                    faults[n] = by_node.get(n, ())
        for part in (FLAGS, SWITCHES, WINDOWS):
            if parts[part] is None or (own is not None and part in own.parts):
                parts[part] = read = repos.part(part)
                if own is None:
                    self._keep_part(version, part, read)
        return _filtered(faults, parts, wanted)

    def _read_whole(
        self,
        version: int | None,
        wanted: set[str] | None,
        own: Changes | None,
        repos: StoreReads,
    ) -> EvidenceRows:
        faults = _by_node(repos.faults(None))
        parts: dict[str, list[Row[Any]] | None] = {
            part: repos.part(part) for part in (FLAGS, SWITCHES, WINDOWS)
        }
        if own is None and version is not None:  # what it read is the store at `version`
            with self._lock:
                self._drop()
                self.version = version
                self._faults = dict(faults)  # the view's own, changed by later reads
                self._node_of = {f.id: n for n, fs in faults.items() for f in fs}
                self._parts = dict(parts)
        return _filtered(faults, parts, wanted)

    def _keep_nodes(
        self, version: int, nodes: Iterable[str], by_node: Mapping[str, tuple[OpenFault, ...]]
    ) -> None:
        with self._lock:
            if self.version != version:
                return
            for n in nodes:
                for f in self._faults.pop(n, ()):
                    self._node_of.pop(f.id, None)
                    self._built.pop(f.id, None)
                kept = by_node.get(n)
                if kept:
                    self._faults[n] = kept
                    for f in kept:
                        self._node_of[f.id] = n
                self._stale.discard(n)

    def _keep_part(self, version: int, part: str, rows: list[Row[Any]]) -> None:
        with self._lock:
            if self.version == version:
                self._parts[part] = rows


def _filtered(
    faults: Mapping[str, Sequence[Any]],
    parts: Mapping[str, list[Row[Any]] | None],
    wanted: set[str] | None,
) -> EvidenceRows:
    flags, switches, windows = parts[FLAGS], parts[SWITCHES], parts[WINDOWS]
    assert flags is not None, "every part is read before it is filtered"
    assert switches is not None, "every part is read before it is filtered"
    assert windows is not None, "every part is read before it is filtered"
    if wanted is None:
        picked = [f for fs in faults.values() for f in fs]
    elif len(wanted) < len(faults):
        picked = [f for n in wanted for f in faults.get(n, ())]
    else:
        picked = [f for n, fs in faults.items() if n in wanted for f in fs]
    picked.sort(key=lambda f: f.id)
    return EvidenceRows(
        picked, flags_on(flags, wanted), list(switches), windows_on(windows, wanted)
    )


def _by_node(faults: Iterable[OpenFault]) -> dict[str, tuple[OpenFault, ...]]:
    """Open faults by node, each node's in the order read."""
    by_node: dict[str, list[OpenFault]] = {}
    for f in faults:
        by_node.setdefault(f.node, []).append(f)
    return {n: tuple(fs) for n, fs in by_node.items()}


def flags_on(flags: Iterable[Row[Any]], wanted: set[str] | None) -> list[Row[Any]]:
    """The quarantine flags that concern `wanted` nodes (every one when None)."""
    return [q for q in flags if wanted is None or q.node in wanted]


def windows_on(windows: Iterable[Row[Any]], wanted: set[str] | None) -> list[Row[Any]]:
    """The maintenance windows that concern `wanted` nodes (every one when None): those on
    the nodes and every switch-wide one (the rule `MaintenanceRepo.in_force` reads by)."""
    return [w for w in windows if wanted is None or w.switch is not None or w.node in wanted]


# --- one view per engine, and the hooks that follow its commits --------------------------

_VIEWS: weakref.WeakKeyDictionary[Engine, EvidenceView] = weakref.WeakKeyDictionary()


def attach(engine: Engine) -> EvidenceView:
    """Keep this engine's evidence in memory (the service's engine; `view_of` then finds it)."""
    view = _VIEWS.get(engine)
    if view is None:
        view = _VIEWS[engine] = EvidenceView()
        event.listen(engine.pool, "checkin", _on_checkin(engine))
    return view


def view_of(session: Session) -> EvidenceView | None:
    bind = session.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine
    return _VIEWS.get(engine)


def _on_checkin(engine: Engine) -> Any:
    """The pool's hook: a connection back in the pool has ended its transaction, and a
    commit it made is taken in."""
    ref = weakref.ref(engine)

    def checkin(_dbapi: Any, record: Any) -> None:
        record.info.pop(_CHANGES, None)  # a transaction never committed: nothing to take in
        _take_in(ref(), record.info)

    return checkin


def _take_in(engine: Engine | None, info: dict[Any, Any]) -> None:
    done = info.pop(_COMMITTED, None)
    if done is None or engine is None:
        return
    view = _VIEWS.get(engine)
    if view is not None:
        view.committed(*done)


_WRITE_HEADS = ("INSERT", "UPDATE", "DELETE", "WITH", "TRUNCATE")


def _parts_written(statement: str) -> set[str]:
    """The evidence's parts a statement writes (most statements are reads: one look at
    their first word)."""
    head = statement.lstrip()[:8].upper()
    if not head.startswith(_WRITE_HEADS):
        return set()
    if head == "TRUNCATE":
        return {p for t, p in TABLE_PART.items() if re.search(rf"\b{t}\b", statement)}
    return {TABLE_PART[t.lower()] for t in _WRITES.findall(statement) if t.lower() in TABLE_PART}


def _nodes_written(conn: Connection, context: ExecutionContext | None) -> set[str] | None:
    """The nodes a write to faults or rnics touched, from its parameters; None: unknown."""
    params = getattr(context, "compiled_parameters", None)
    if not params:
        return None
    view = _VIEWS.get(conn.engine)
    nodes = set()
    for p in params:
        node = next((p[k] for k in _NODE_PARAMS if isinstance(p.get(k), str)), None)
        if node is None and view is not None and isinstance(p.get(_FAULT_ID_PARAM), int):
            node = view.node_of(p[_FAULT_ID_PARAM])
        if node is None:
            return None
        nodes.add(node)
    return nodes


@event.listens_for(Engine, "before_cursor_execute")
def _sent(
    conn: Connection,
    _cursor: Any,
    statement: str,
    _parameters: Any,
    context: ExecutionContext | None,
    _executemany: bool,
) -> None:
    parts = _parts_written(statement)
    if not parts:
        return
    changes = conn.info.get(_CHANGES)
    if changes is None:
        changes = conn.info[_CHANGES] = Changes()
    for part in parts:
        if part != FAULTS:
            changes.parts.add(part)
        elif not changes.every_node:
            nodes = _nodes_written(conn, context)
            if nodes is None:
                changes.every_node = True
            else:
                changes.nodes |= nodes


@event.listens_for(Engine, "begin")
def _begun(conn: Connection) -> None:
    _take_in(conn.engine, conn.info)  # the connection's last commit, if not taken in yet
    conn.info.pop(_CHANGES, None)


@event.listens_for(Engine, "commit")
def _committing(conn: Connection) -> None:
    changes: Changes | None = conn.info.pop(_CHANGES, None)
    if changes is None:
        return
    if not _has_stamp(conn):
        return  # a store migrated to before the stamp: nothing keeps a view of it
    version = conn.execute(_BUMP, {"fresh": secrets.randbits(48) << 12}).scalar_one()
    conn.info[_COMMITTED] = (int(version), changes)


@event.listens_for(Engine, "rollback")
def _rolled_back(conn: Connection) -> None:
    conn.info.pop(_CHANGES, None)
    conn.info.pop(_COMMITTED, None)


_HAS_STAMP: weakref.WeakSet[Engine] = weakref.WeakSet()


def _has_stamp(conn: Connection) -> bool:
    """Whether the store has the stamp's table (a store at an older migration has not)."""
    if conn.engine in _HAS_STAMP:
        return True
    found = conn.dialect.has_table(conn, "evidence_stamp")
    if found:
        _HAS_STAMP.add(conn.engine)
    return bool(found)
