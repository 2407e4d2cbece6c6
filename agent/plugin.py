"""The unix-socket listener the native plugin talks to, and the command relay.

Frames are the plugin's wire format (``native_plugin.wire``, mirroring
``railover_wire.h``); this module only maps them to events and back. A
connection that sends a malformed or oversized frame is dropped and counted;
the listener itself never stops for a client's mistake.

A command goes only to the processes of the job (and incarnation) it is for
(``PluginClient.is_for``; the rule is ``railover_wire.h``'s "How a process is
tied to its job"): a process that named its job in its HELLO gets that job's
commands and no other's; one that named none gets a command only where no other
job on the node can be it.

Any local process in the socket's group can connect, so nothing one sends may delay
another's fault (issue 30; every limit is an agent setting, ``PluginLimits``):

- progress is kept per (job, communicator, rank), newest count only, and built into an
  event once per poll; the communicators tracked are bounded per connection and per
  node, and forgotten when the last connection that reported them closes;
- an ack is passed on only for a command the hub handed out, from a process it was
  for, once per (rank, status); the ack queue is bounded. An ack for a command the hub
  does not know waits (bounded, for command_hold_s) for the service to hand that
  command out: after an agent restart a rank may answer before the service has sent
  the new agent the commands its predecessor relayed;
- the events of one read of a connection are spooled in one transaction;
- a connection that says no HELLO in time, or leaves a frame half sent, is closed; one
  process holds a bounded number of connections;
- device names must be RNIC names (the service's pattern); names a client sends are
  escaped before they reach a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent import metrics
from agent.events import Event, new_event
from agent.logsafe import Every, printable
from native_plugin import wire, wire_codec

log = logging.getLogger(__name__)

# enum ibv_event_type values (libibverbs verbs.h) the agent treats specially.
IBV_EVENT_DEVICE_FATAL = 8
IBV_EVENT_PORT_ACTIVE = 9
IBV_EVENT_PORT_ERR = 10

READ_CHUNK = 16 * 1024
# The service's DeviceName (scheduler_svc/api/schemas/fields.py): an RNIC name as the
# kernel writes it. Anything else in a frame is a client's mistake or an attack.
DEVICE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_refusals = Every(log)

ProgressKey = tuple[str, int, int | None]  # (job, comm_id, rank)


@dataclass(frozen=True)
class PluginLimits:
    """The bounds on what plugin clients can make the agent hold (agent settings)."""

    max_communicators: int = 4096
    max_communicators_per_client: int = 256
    max_acks: int = 10_000
    max_clients: int = 512
    max_clients_per_process: int = 64
    hello_timeout_s: float = 10.0
    frame_timeout_s: float = 5.0


def _device_name(name: str) -> None:
    """Refuse a frame naming a device no kernel would (empty means not given)."""
    if name and not DEVICE_NAME_RE.match(name):
        raise wire.WireError(f"device name '{printable(name)}' is not an RNIC name")


def _ts(ns: int) -> datetime | None:
    # CLOCK_REALTIME from the plugin; 0 (not given) or nonsense falls back to now.
    if ns <= 0 or ns > 2**62:
        return None
    return datetime.fromtimestamp(ns / 1e9, UTC)


@dataclass(eq=False)
class PluginClient:
    writer: asyncio.StreamWriter
    comm_id: int = 0
    rank: int | None = None
    pid: int = 0
    hello: bool = False
    # The NCCL profiler plugin reports but reads no commands.
    takes_commands: bool = True
    # The plugin's ABI (HELLO): from wire.ABI_WITH_EXTENSIONS on it reads BALANCE and
    # NVL_TRANSIT with their extension frames.
    abi_version: int = 0
    # The job the process named in its HELLO and that job's incarnation; "" and 0 when it
    # named none (a plugin before wire version 2, or a launcher that set no RAILOVER_JOB_ID)
    # or does not know it.
    job: str = ""
    incarnation: int = 0
    # The (job, comm_id, rank) progress keys this connection reported (bounded).
    keys: set[ProgressKey] = field(default_factory=set)
    # Its process as the kernel says (SO_PEERCRED), not as its frames claim; 0 unknown.
    peer_pid: int = 0

    def matches(self, comm_id: int, ranks: list[int]) -> bool:
        # A client that did not say its communicator (comm_id 0) gets everything.
        if self.comm_id and comm_id and self.comm_id != comm_id:
            return False
        return not ranks or self.rank is None or self.rank in ranks

    def is_for(self, cmd: dict[str, Any], comm_id: int, ranks: list[int]) -> bool:
        """Whether this process is one of those the command is for."""
        if not self.matches(comm_id, ranks):
            return False
        if self.job:
            if self.job != str(cmd.get("job_id") or ""):
                return False
            wanted = cmd.get("incarnation")
            return not self.incarnation or wanted is None or int(wanted) == self.incarnation
        return not self.could_be_another_jobs(cmd, comm_id)

    def could_be_another_jobs(self, cmd: dict[str, Any], comm_id: int) -> bool:
        """A process that named no job, which another job on the node may own: it says a
        rank number (or none) another job holds here, and no communicator of the command's."""
        if self.job:
            return False
        if comm_id and self.comm_id == comm_id:
            return False  # a communicator belongs to one job (the service refuses a second)
        others = cmd.get("other_jobs_ranks")
        if others is None:
            return False  # a service from before the field cannot say: delivered as before
        if self.rank is None:
            return bool(others)
        return self.rank in others


@dataclass
class PendingCommand:
    command: dict[str, Any]
    first_seen: float
    delivered_to: int = 0


@dataclass
class HandedCommand:
    """A command relayed to plugin clients: what an ack may answer, and what was said."""

    command: dict[str, Any]
    # (rank, status) already passed on, so a repeat is not.
    acked: set[tuple[int | None, str]] = field(default_factory=set)


@dataclass
class AckRequest:
    command_id: int
    status: str
    rank: int | None
    detail: str
    # The rank's ops_done when it answered: from an ACK_AT frame, else (for a too_late
    # ack) the newest count the rank reported; None when neither is known.
    ops_done: int | None = None
    attempts: int = 0


# At most this many acks go out in one round of the ack loop.
ACK_ROUND = 4096


@dataclass
class AckBatch:
    """Acks of several ranks of this node that say the same thing: one request to the service."""

    command_id: int
    status: str
    ranks: list[int] | None  # None: the ack speaks for the whole node
    detail: str
    ops_done: int | None
    members: list[AckRequest]


def batch_acks(reqs: list[AckRequest]) -> list[AckBatch]:
    """Group per-rank acks of one command, status and op count; keep each first one's place.

    A node's ranks apply a switch point at the same op, so their eight (or more)
    acks become one request. An ack that names no rank speaks for the node and
    stays on its own.
    """
    out: list[AckBatch] = []
    open_batches: dict[tuple[int, str, int | None], AckBatch] = {}
    for r in reqs:
        if r.rank is None:
            out.append(AckBatch(r.command_id, r.status, None, r.detail, r.ops_done, [r]))
            continue
        key = (r.command_id, r.status, r.ops_done)
        batch = open_batches.get(key)
        if batch is None or batch.ranks is None or r.rank in batch.ranks:
            batch = AckBatch(r.command_id, r.status, [], r.detail, r.ops_done, [])
            open_batches[key] = batch
            out.append(batch)
        assert batch.ranks is not None
        batch.ranks.append(r.rank)
        batch.members.append(r)
        if r.detail != batch.detail:
            batch.detail = f"{len(batch.ranks)} ranks: " + "; ".join(
                dict.fromkeys(m.detail for m in batch.members)
            )
    return out


def _bitmask(channels: list[int]) -> int:
    mask = 0
    for c in channels:
        if 0 <= c < 64:
            mask |= 1 << c
    return mask


def to_wire_command(cmd: dict[str, Any]) -> wire.Command | None:
    """The COMMAND frame for a service command, or None if the wire has no such kind."""
    kind = getattr(wire.CommandKind, str(cmd.get("kind", "")).upper(), None)
    if kind is None:
        return None
    return wire.Command(
        command_id=int(cmd["command_id"]),
        comm_id=int(cmd.get("comm_id") or 0),
        ops_done=int(cmd.get("ops_done") or 0),
        disabled_channels=_bitmask(list(cmd.get("disabled_channels") or [])),
        kind=int(kind),
        epoch=int(cmd.get("epoch") or 0),
        iteration=int(cmd.get("iteration") or 0),
    )


def to_wire_extension(
    cmd: dict[str, Any], frame: wire.Command
) -> wire.CommandWeights | wire.CommandTransit | None:
    """The frame that follows a BALANCE or NVL_TRANSIT command; None for other kinds."""
    if frame.kind == wire.CommandKind.BALANCE:
        weights = [float(w) for w in cmd.get("channel_weights") or []]
        return wire.CommandWeights.of(
            frame.command_id, weights, float(cmd.get("split_ratio") or 0.0)
        )
    if frame.kind == wire.CommandKind.NVL_TRANSIT:
        transit = {int(r): int(g) for r, g in cmd.get("transit") or []}
        mb = int(cmd.get("transit_mb_per_channel") or 0)
        return wire.CommandTransit.of(frame.command_id, transit, mb)
    return None


def frames_for(cmd: dict[str, Any], abi_version: int) -> bytes | None:
    """The bytes a plugin of this ABI gets for a command; None when it cannot take it.

    A plugin older than ABI 2 would drop the connection on an extension frame: it gets
    a BALANCE as the REBALANCE of the same channels, and no NVL_TRANSIT at all.
    """
    frame = to_wire_command(cmd)
    if frame is None:
        return None
    ext = to_wire_extension(cmd, frame)
    if ext is None:
        return wire_codec.encode(frame)
    if abi_version >= wire.ABI_WITH_EXTENSIONS:
        return wire_codec.encode(frame) + wire_codec.encode(ext)
    if frame.kind == wire.CommandKind.BALANCE:
        return wire_codec.encode(replace(frame, kind=wire.CommandKind.REBALANCE))
    return None


@dataclass
class PluginHub:
    """Connected clients, commands waiting for one, acks waiting for the service."""

    node: str
    spool_events: Callable[[list[Event]], object]
    hold_s: float
    limits: PluginLimits = field(default_factory=PluginLimits)
    clients: set[PluginClient] = field(default_factory=set)
    pending: dict[int, PendingCommand] = field(default_factory=dict)
    # command_id -> ack status already queued, so a command the service
    # returns again (our ack was lost) is re-acked, not re-applied.
    handled: dict[int, str] = field(default_factory=dict)
    acks: asyncio.Queue[AckRequest] = field(default_factory=asyncio.Queue)
    # Commands relayed to a client, by id (bounded with `handled`): acks answer these.
    handed: dict[int, HandedCommand] = field(default_factory=dict)
    # Latest progress per (job, comm_id, rank): the CCL may report every
    # collective; the service needs the newest count, once per poll. The frame and its
    # client's incarnation; the event is made when the poll takes it.
    progress: dict[ProgressKey, tuple[wire.Progress, int]] = field(default_factory=dict)
    # (comm_id, rank, pid) already announced: the NCCL profiler re-announces its
    # communicators on every reconnection, the service needs each once. Oldest out first
    # beyond max_communicators (a repeat costs the service one upsert).
    announced: dict[tuple[int, int, int], None] = field(default_factory=dict)
    # Newest ops_done per (job, comm_id, rank), kept across polls for too-late acks, until
    # the last connection that reported it closes.
    last_ops: dict[ProgressKey, int] = field(default_factory=dict)
    # Acks for commands not (yet) handed out, by (command_id, rank, status): the client,
    # the ack and when it came. Oldest out first beyond max_held_acks.
    held_acks: dict[tuple[int, int | None, str], tuple[PluginClient, AckRequest, float]] = field(
        default_factory=dict
    )
    # Events of the frames being handled, spooled together (`on_messages`).
    _outbox: list[Event] = field(default_factory=list)

    # -- plugin -> agent ------------------------------------------------------------------------
    def on_messages(self, client: PluginClient, msgs: list[wire.Message]) -> None:
        """Handle one read's frames; their events go to the spool in one transaction, those
        before a bad frame included."""
        try:
            for msg in msgs:
                self.on_message(client, msg)
        finally:
            self.flush()

    def flush(self) -> None:
        if self._outbox:
            out, self._outbox = self._outbox, []
            self.spool_events(out)

    def on_message(self, client: PluginClient, msg: wire.Message) -> None:
        """Handle one frame (its event waits for `flush`)."""
        metrics.PLUGIN_FRAMES.labels(type(msg).__name__).inc()
        ev: Event | None = None
        rank = client.rank
        comm = client.comm_id or None
        if isinstance(msg, wire.Hello):
            client.comm_id = msg.comm_id
            client.rank = None if msg.rank == wire.RANK_UNKNOWN else msg.rank
            client.pid = msg.pid
            client.hello = True
            client.takes_commands = msg.abi_version != wire.HELLO_NCCL_PROFILER
            client.abi_version = msg.abi_version
            client.job = msg.job
            client.incarnation = msg.incarnation
            self.deliver_pending()
            return
        if isinstance(msg, wire.CqeError):
            _device_name(msg.dev_name)
            ev = new_event(
                self.node,
                "cqe_error",
                observed_at=_ts(msg.timestamp_ns),
                device=msg.dev_name or None,
                port=msg.port or None,
                wc_status=msg.wc_status,
                vendor_err=msg.vendor_err,
                comm_id=comm,
                rank=rank,
                detail={"qp_num": msg.qp_num, "peer": msg.peer, "pid": msg.pid},
            )
        elif isinstance(msg, wire.PortEvent):
            _device_name(msg.dev_name)
            fatal = msg.ibv_event_type == IBV_EVENT_DEVICE_FATAL
            ev = new_event(
                self.node,
                "device_fatal" if fatal else "port_event",
                observed_at=_ts(msg.timestamp_ns),
                device=msg.dev_name or None,
                port=msg.port or None,
                event_type=msg.ibv_event_type,
                comm_id=comm,
                rank=rank,
                detail={"pid": msg.pid},
            )
        elif isinstance(msg, wire.PathSwitch):
            _device_name(msg.from_dev)
            _device_name(msg.to_dev)
            try:
                reason = wire.SwitchReason(msg.reason).name.lower()
            except ValueError:
                reason = str(msg.reason)
            ev = new_event(
                self.node,
                "path_switch",
                observed_at=_ts(msg.timestamp_ns),
                device=msg.from_dev or None,
                comm_id=msg.comm_id,
                rank=rank,
                detail={
                    "channel": msg.channel,
                    "reason": reason,
                    "from_dev": msg.from_dev,
                    "to_dev": msg.to_dev,
                    "pid": msg.pid,
                },
            )
        elif isinstance(msg, wire.Progress):
            self._progress(client, msg)
            return
        elif isinstance(msg, wire.Communicator):
            key = (msg.comm_id, msg.rank, msg.pid)
            if msg.comm_id == 0 or msg.rank == wire.RANK_UNKNOWN or key in self.announced:
                return
            while len(self.announced) >= self.limits.max_communicators:
                del self.announced[next(iter(self.announced))]
            self.announced[key] = None
            ev = new_event(
                self.node,
                "communicator",
                observed_at=_ts(msg.timestamp_ns),
                comm_id=msg.comm_id,
                rank=msg.rank,
                nranks=msg.nranks,
                job_id=msg.job or None,
                detail={"n_nodes": msg.n_nodes, "pid": msg.pid, "host": msg.host},
            )
        elif isinstance(msg, wire.Stall):
            # Evidence that a collective hangs on this node's ranks; not a NIC
            # fault until sysfs or a CQE says which NIC.
            ev = new_event(
                self.node,
                "stall",
                observed_at=_ts(msg.timestamp_ns),
                comm_id=msg.comm_id,
                rank=None if msg.rank == wire.RANK_UNKNOWN else msg.rank,
                seq_number=msg.seq_number,
                detail={"func": msg.func, "open_s": round(msg.open_ns / 1e9, 3), "pid": msg.pid},
            )
        elif isinstance(msg, (wire.Ack, wire.AckAt)):
            self.on_ack(client, msg)
            return
        else:
            # A COMMAND from a client is the wrong direction: protocol error.
            raise wire.WireError(f"unexpected {type(msg).__name__} from a plugin client")
        self._outbox.append(ev)

    def _progress(self, client: PluginClient, msg: wire.Progress) -> None:
        r = None if msg.rank == wire.RANK_UNKNOWN else msg.rank
        # By job too: two jobs on the node may both have comm 0 and this rank number.
        key = (client.job, msg.comm_id, r)
        if key not in client.keys:
            if len(client.keys) >= self.limits.max_communicators_per_client:
                metrics.PLUGIN_PROGRESS_DROPPED.labels("client_limit").inc()
                return
            if key not in self.last_ops and len(self.last_ops) >= self.limits.max_communicators:
                metrics.PLUGIN_PROGRESS_DROPPED.labels("node_limit").inc()
                return
            client.keys.add(key)
        self.last_ops[key] = msg.ops_done
        self.progress[key] = (msg, client.incarnation)

    def take_progress(self) -> list[Event]:
        """The newest progress of each (job, communicator, rank) since the last take."""
        out = [
            new_event(
                self.node,
                "progress",
                observed_at=_ts(msg.timestamp_ns),
                comm_id=msg.comm_id,
                rank=rank,
                ops_done=msg.ops_done,
                # Whose count it is: the service keeps only the job's current incarnation's.
                job_id=job or None,
                incarnation=incarnation or None,
            )
            for (job, _, rank), (msg, incarnation) in self.progress.items()
        ]
        self.progress.clear()
        return out

    def forget(self, client: PluginClient) -> None:
        """A connection closed: drop what only it kept alive (its communicators' counts)."""
        self.clients.discard(client)
        if not client.keys:
            return
        others = set().union(*(c.keys for c in self.clients)) if self.clients else set()
        for key in client.keys - others:
            self.last_ops.pop(key, None)
        client.keys.clear()

    def _ack_refused(self, client: PluginClient, cid: int, reason: str) -> None:
        metrics.PLUGIN_ACKS_REFUSED.labels(reason).inc()
        _refusals.log(
            logging.WARNING,
            "ignoring an ack for command %d from pid %d (%s)",
            cid,
            client.pid,
            reason.replace("_", " "),
        )

    def on_ack(self, client: PluginClient, msg: wire.Ack | wire.AckAt) -> None:
        ops_done = msg.ops_done if isinstance(msg, wire.AckAt) else None
        if msg.status == wire.AckStatus.APPLIED:
            status, detail = "applied", ""
        elif msg.status == wire.AckStatus.TOO_LATE:
            # Past the switch point: the service proposes a later one, past this count.
            status, detail = "too_late", "too_late"
            if ops_done is None:
                ops_done = self.last_ops.get((client.job, client.comm_id, client.rank))
        else:
            try:
                detail = wire.AckStatus(msg.status).name.lower()
            except ValueError:
                detail = f"status {msg.status}"
            status = "failed"
        if ops_done is not None:
            detail = f"{detail} at ops_done {ops_done}".strip()
        req = AckRequest(
            msg.command_id, status, client.rank, f"{detail} (pid {msg.pid})".strip(), ops_done
        )
        if msg.command_id in self.handed:
            self._pass_ack(client, req)
            return
        # Not handed out by this agent (yet): hold it until the service sends the command.
        key = (req.command_id, req.rank, req.status)
        if key in self.held_acks:
            self._ack_refused(client, req.command_id, "duplicate")
            return
        if len(self.held_acks) >= self.max_held_acks:
            oldest = next(iter(self.held_acks))
            del self.held_acks[oldest]
            self._ack_refused(client, oldest[0], "unknown_command")
        self.held_acks[key] = (client, req, time.monotonic())

    @property
    def max_held_acks(self) -> int:
        return max(16, self.limits.max_acks // 10)

    def _pass_ack(self, client: PluginClient, req: AckRequest) -> None:
        """Queue an ack for the service if it answers a command handed to its client."""
        handed = self.handed[req.command_id]
        cmd = handed.command
        ranks = [int(r) for r in cmd.get("ranks") or []]
        # A connection that said no HELLO gets no command, so it has none to answer.
        addressed = client.hello and client.takes_commands
        if not addressed or not client.is_for(cmd, int(cmd.get("comm_id") or 0), ranks):
            self._ack_refused(client, req.command_id, "not_addressed")
            return
        if (req.rank, req.status) in handed.acked:
            self._ack_refused(client, req.command_id, "duplicate")
            return
        if self.acks.qsize() >= self.limits.max_acks:
            self._ack_refused(client, req.command_id, "queue_full")
            return
        handed.acked.add((req.rank, req.status))
        self.acks.put_nowait(req)

    def _release_held(self, cid: int) -> None:
        """The service handed out a command some ranks had answered already: pass those on."""
        for key in [k for k in self.held_acks if k[0] == cid]:
            client, req, _ = self.held_acks.pop(key)
            self._pass_ack(client, req)

    def _expire_held(self, now: float) -> None:
        while self.held_acks:
            key, (client, _, at) = next(iter(self.held_acks.items()))
            if now - at < self.hold_s:
                return
            del self.held_acks[key]
            self._ack_refused(client, key[0], "unknown_command")

    # -- service -> plugin ----------------------------------------------------------------------
    def on_command(self, cmd: dict[str, Any]) -> bool:
        """Take a command from the service; True if it was new to us."""
        cid = int(cmd["command_id"])
        if cid in self.handled:
            # The service keeps returning a delivered command until the CCL
            # acks it applied; that is not news. Any other status coming back
            # means our ack did not land: say it again.
            if self.handled[cid] != "delivered":
                self.acks.put_nowait(AckRequest(cid, self.handled[cid], None, "re-ack"))
            return False
        if cid in self.pending:
            return False
        metrics.COMMANDS_RECEIVED.inc()
        frame = to_wire_command(cmd)
        if frame is None:
            self._finish(cid, "failed", f"kind {cmd.get('kind')!r} has no wire encoding")
            return True
        try:
            to_wire_extension(cmd, frame)
        except (wire.WireError, TypeError, ValueError) as exc:
            self._finish(cid, "failed", f"command {cid} does not fit the wire: {exc}")
            return True
        self.pending[cid] = PendingCommand(cmd, time.monotonic())
        self.deliver_pending()
        return True

    def _finish(self, cid: int, status: str, detail: str) -> None:
        pc = self.pending.pop(cid, None)
        self.handled[cid] = status
        if status == "delivered" and pc is not None:
            self.handed[cid] = HandedCommand(pc.command)
            if self.held_acks:
                self._release_held(cid)
        if len(self.handled) > 10_000:
            for old in list(self.handled)[:5000]:
                del self.handled[old]
                self.handed.pop(old, None)
        self.acks.put_nowait(AckRequest(cid, status, None, detail))

    def deliver_pending(self) -> None:
        now = time.monotonic()
        self._expire_held(now)
        for cid, pc in list(self.pending.items()):
            cmd = pc.command
            frame = to_wire_command(cmd)
            assert frame is not None  # checked in on_command
            ranks = [int(r) for r in cmd.get("ranks") or []]
            takers = [c for c in self.clients if c.hello and c.takes_commands]
            targets = [c for c in takers if c.is_for(cmd, frame.comm_id, ranks)]
            older = 0
            for c in targets:
                data = frames_for(cmd, c.abi_version)
                if data is None:
                    older += 1  # a plugin too old for this kind
                    continue
                try:
                    c.writer.write(data)
                    metrics.PLUGIN_FRAMES_SENT.labels("Command").inc()
                    pc.delivered_to += 1
                except (ConnectionError, RuntimeError) as exc:
                    log.warning("could not write command %d to pid %d: %s", cid, c.pid, exc)
            if pc.delivered_to:
                metrics.COMMANDS_FORWARDED.inc()
                self._finish(cid, "delivered", f"to {pc.delivered_to} plugin client(s)")
            elif older:
                self._finish(
                    cid,
                    "failed",
                    f"unsupported: {older} plugin client(s) for comm_id {frame.comm_id} "
                    f"predate ABI {wire.ABI_WITH_EXTENSIONS} ({cmd.get('kind')})",
                )
            elif now - pc.first_seen >= self.hold_s:
                self._finish(cid, "failed", self._nobody_for(cmd, frame.comm_id, ranks, takers))

    def _nobody_for(
        self, cmd: dict[str, Any], comm_id: int, ranks: list[int], takers: list[PluginClient]
    ) -> str:
        """Why a command found no process within the hold time, for its failed ack."""
        job = cmd.get("job_id")
        detail = (
            f"no plugin client of job {job!r} for comm_id {comm_id} on this node "
            f"within {self.hold_s:g}s"
        )
        near = [c for c in takers if c.matches(comm_id, ranks)]
        unnamed = sum(c.could_be_another_jobs(cmd, comm_id) for c in near)
        if unnamed:
            detail += (
                f"; {unnamed} that named no job could be another job's (its rank number is "
                "held by another job on this node): set RAILOVER_JOB_ID for the job's processes"
            )
        other = sum(
            bool(c.job) and c.job == job and not c.is_for(cmd, comm_id, ranks) for c in near
        )
        if other:
            detail += f"; {other} of another incarnation of {job!r}"
        return detail


class PluginServer:
    """Accepts plugin connections on a unix socket."""

    def __init__(
        self,
        path: Path,
        hub: PluginHub,
        mode: int,
        max_clients: int | None = None,
    ) -> None:
        self.path = path
        self.hub = hub
        self.mode = mode
        self.limits = hub.limits
        self.max_clients = self.limits.max_clients if max_clients is None else max_clients
        self._per_process: dict[int, int] = {}
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            if _socket_alive(self.path):
                raise RuntimeError(f"another agent is listening on {self.path}")
            # Left behind by an agent that died; safe to take over.
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        os.chmod(self.path, self.mode)
        log.info("plugin socket listening on %s", self.path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for c in list(self.hub.clients):
                c.writer.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def _refuse(self, writer: asyncio.StreamWriter, reason: str, msg: str, *args: object) -> None:
        metrics.PLUGIN_REFUSED.labels(reason).inc()
        _refusals.log(logging.WARNING, msg, *args)
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.hub.clients) >= self.max_clients:
            self._refuse(
                writer, "slots", "refusing plugin connection: %d clients already", self.max_clients
            )
            return
        pid = _peer_pid(writer)
        if pid and self._per_process.get(pid, 0) >= self.limits.max_clients_per_process:
            self._refuse(
                writer,
                "process_slots",
                "refusing plugin connection: process %d holds %d already",
                pid,
                self.limits.max_clients_per_process,
            )
            return
        client = PluginClient(writer=writer, peer_pid=pid)
        self.hub.clients.add(client)
        if pid:
            self._per_process[pid] = self._per_process.get(pid, 0) + 1
        metrics.PLUGIN_CLIENTS.set(len(self.hub.clients))
        try:
            await self._serve(client, reader)
        except (ConnectionError, OSError) as exc:
            log.info("plugin connection (pid %d) ended: %s", client.pid, exc)
        finally:
            self.hub.forget(client)
            if pid:
                left = self._per_process.pop(pid, 1) - 1
                if left > 0:
                    self._per_process[pid] = left
            metrics.PLUGIN_CLIENTS.set(len(self.hub.clients))
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, client: PluginClient, reader: asyncio.StreamReader) -> None:
        decoder = wire_codec.FrameDecoder()
        hello_by = time.monotonic() + self.limits.hello_timeout_s
        partial_since: float | None = None
        while True:
            # A process that never says HELLO, or leaves a frame half sent, holds a slot
            # and a buffer for nothing: each has a deadline. After HELLO a quiet client
            # is normal (a CCL with no fault says nothing).
            deadline, why = None, ""
            if not client.hello:
                deadline, why = hello_by, "hello"
            if partial_since is not None:
                frame_by = partial_since + self.limits.frame_timeout_s
                if deadline is None or frame_by < deadline:
                    deadline, why = frame_by, "partial_frame"
            try:
                async with asyncio.timeout_at(None if deadline is None else _loop_time(deadline)):
                    data = await reader.read(READ_CHUNK)
            except TimeoutError:
                metrics.PLUGIN_REFUSED.labels(why).inc()
                _refusals.log(
                    logging.WARNING,
                    "closing plugin connection (pid %d): %s",
                    client.peer_pid or client.pid,
                    f"no HELLO within {self.limits.hello_timeout_s:g}s"
                    if why == "hello"
                    else f"a frame left unfinished for {self.limits.frame_timeout_s:g}s",
                )
                return
            if not data:
                return
            try:
                msgs = decoder.feed(data)
            except wire.WireError as exc:
                # Act on the good frames that came before the bad one.
                self._safe_on_messages(client, exc.decoded)
                metrics.PLUGIN_MALFORMED.inc()
                log.warning("dropping plugin connection (pid %d): %s", client.pid, exc)
                return
            if decoder.buffered == 0:
                partial_since = None
            elif partial_since is None or msgs:
                partial_since = time.monotonic()
            if not self._safe_on_messages(client, msgs):
                metrics.PLUGIN_MALFORMED.inc()
                return

    def _safe_on_messages(self, client: PluginClient, msgs: list[wire.Message]) -> bool:
        try:
            self.hub.on_messages(client, msgs)
        except wire.WireError as exc:
            log.warning("dropping plugin connection (pid %d): %s", client.pid, exc)
            return False
        return True


def _loop_time(monotonic_at: float) -> float:
    """A time.monotonic() instant on the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_at - time.monotonic())


def _peer_pid(writer: asyncio.StreamWriter) -> int:
    """The connecting process's id from the kernel (SO_PEERCRED); 0 where unavailable."""
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return 0
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return 0
    pid, _, _ = struct.unpack("3i", creds)
    return int(pid)


def _socket_alive(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(0.5)
        s.connect(str(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
            log.debug("probe of %s: %s", path, exc)
        return False
    finally:
        s.close()
    return True
