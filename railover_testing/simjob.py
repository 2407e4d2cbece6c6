"""A stand-in training job whose ranks talk to their node's agent through the real plugin.

Each rank is a thread with its own ``Plugin`` handle (its own socket connection and
HELLO carrying ``comm_id``, ``rank`` and the job's id), as each GPU's proxy thread in a CCL
process would have. The ranks run collective operations in lockstep: one barrier per op, as an
allreduce completes on every rank or on none. Around that they follow the switch-point
contract of ``railover_plugin.h`` ("Switch points"), as a failover-capable CCL must:

* A REBALANCE or FAILBACK command for op N (``Command.ops_done``) is *armed* when it
  arrives while the rank's ops_done < N; one arriving later is acknowledged
  ``TOO_LATE`` with the rank's ops_done and never applied. A newer epoch for the
  communicator replaces an older armed one; an older one arriving after a newer one
  is ignored.
* Every op's barrier is also a round of the in-band agreement (fused into the
  collective): each rank contributes a ``SwitchVote`` of what it has armed, and each
  rank decides with the library's own ``agree()`` on the gathered votes. The plan is
  applied at N (and acknowledged ``APPLIED`` at N) only if *every* rank armed the same
  epoch and plan in time; otherwise no rank applies it, and each rank that had armed
  it acknowledges ``TOO_LATE`` with its ops_done, so the service re-triggers beyond it.
* ABORT stops the whole job after the current op; FAILOVER is recorded and
  acknowledged at once (s-Bond moves the rank's traffic to its backup RNIC locally),
  and drops a FAILBACK of an older epoch still armed (a return it overtakes).
* BALANCE is a switch point like REBALANCE; when it applies, the rank's channel
  weights (``RankLog.channel_weights``) and allreduce split become the command's.
  NVL_TRANSIT applies at once: the rank's ``transit_gpu`` becomes the one the
  command names for it. FAILBACK returns both to even weights and no transit.
  Commands are taken with ``poll_command_v2`` (the ABI 2 view).

Every application is logged per rank as ``Applied(op, epoch, ...)`` for tests to
compare. ``slow_rank`` makes one rank hold its first ``slow_commands`` switch commands
until it has passed their trigger, the deterministic version of a rank whose proxy
thread is late to look.

Pacing is by sleeping ``op_interval_s`` per op (no spinning); the job stops itself
after ``max_runtime_s`` or ``max_ops`` and ``stop()`` ends it after the op in flight.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from native_plugin.binding import AgreeAction, CclCommand, Plugin, Round, SwitchVote
from native_plugin.wire import AckStatus, CommandKind

__all__ = [
    "Ack",
    "Applied",
    "JobError",
    "RankLog",
    "Received",
    "SimulatedJob",
    "channels_of",
]

log = logging.getLogger(__name__)

SWITCH_KINDS: Final = frozenset({CommandKind.REBALANCE, CommandKind.FAILBACK, CommandKind.BALANCE})


def channels_of(mask: int) -> tuple[int, ...]:
    """The channel numbers set in a ``disabled_channels`` bitmask."""
    return tuple(i for i in range(64) if mask >> i & 1)


class JobError(RuntimeError):
    """The simulated job could not start, or a rank thread failed."""


@dataclass(frozen=True, slots=True)
class Applied:
    """A plan a rank switched to: from op ``op`` on, ``disabled_channels`` are off."""

    op: int
    epoch: int
    kind: int
    disabled_channels: tuple[int, ...]
    command_id: int
    weights: tuple[float, ...] = ()  # BALANCE: each channel's share
    split_ratio: float = 0.0  # BALANCE: the allreduce hand-off

    @property
    def plan(self) -> tuple[int, int, int, tuple[int, ...]]:
        """What every rank must agree on (the command id differs per node)."""
        return (self.op, self.epoch, self.kind, self.disabled_channels)


@dataclass(frozen=True, slots=True)
class Received:
    """A command as ``poll_command`` returned it, and the rank's ops_done then."""

    at_ops_done: int
    command: CclCommand


@dataclass(frozen=True, slots=True)
class Ack:
    """An answer the rank gave; ``queued`` is False if the plugin dropped it."""

    command_id: int
    status: int
    at_ops_done: int
    queued: bool


@dataclass
class RankLog:
    """What one rank saw and did; appended by its thread, copied by readers."""

    rank: int
    node: str
    gpu: int
    received: list[Received] = field(default_factory=list)
    applied: list[Applied] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    # (ops_done, command) for every FAILOVER the rank acted on.
    failovers: list[tuple[int, CclCommand]] = field(default_factory=list)
    # The plan the rank runs now: channel weights (empty: even), allreduce split, and
    # the GPU it sends through over NVLink (None: its own RNIC path).
    channel_weights: tuple[float, ...] = ()
    split_ratio: float = 0.0
    transit_gpu: int | None = None
    # (ops_done, transit GPU) for every NVL_TRANSIT the rank acted on.
    transits: list[tuple[int, int | None]] = field(default_factory=list)
    # (ops_done, command) for every CHECKPOINT_NOW: the op after which it "checkpointed".
    checkpoints: list[tuple[int, CclCommand]] = field(default_factory=list)


@dataclass
class _Rank:
    """Per-thread state; only its own thread touches it (logs are read by others)."""

    log: RankLog
    plugin: Plugin
    ops_done: int = 0
    armed: CclCommand | None = None  # proposed, not yet decided by a round
    decided: CclCommand | None = None  # agreed by every rank, applied when ops_done reaches it
    seen: set[int] = field(default_factory=set)
    parked: list[CclCommand] = field(default_factory=list)
    slow_left: int = 0


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What the barrier of one op gathered, read by every rank after it.

    ``votes`` is None when no rank had anything armed (nothing to decide).
    """

    op: int
    votes: Round | None
    stop: bool


class SimulatedJob:
    """One communicator over ``placement``'s ranks, each using the real plugin.

    ``placement`` lists ``(rank, node, gpu)``; ``sockets`` maps each node to its
    agent's plugin socket. ``channels`` is the communicator's channel count (only
    used to validate plans). Use as a context manager, or ``start()``/``stop()``.
    """

    def __init__(
        self,
        job_id: str,
        comm_id: int,
        placement: Sequence[tuple[int, str, int]],
        sockets: Mapping[str, str | os.PathLike[str]],
        *,
        channels: int = 16,
        op_interval_s: float = 0.004,
        progress_every: int = 1,
        slow_rank: int | None = None,
        slow_commands: int = 1,
        max_ops: int | None = None,
        max_runtime_s: float = 120.0,
        connect_timeout_s: float = 10.0,
        lib_path: str | os.PathLike[str] | None = None,
    ) -> None:
        if not placement:
            raise ValueError("placement: a job needs at least one rank")
        ranks = [r for r, _, _ in placement]
        if len(set(ranks)) != len(ranks):
            raise ValueError("placement: rank numbers must be unique")
        missing = sorted({n for _, n, _ in placement} - set(sockets))
        if missing:
            raise ValueError(f"sockets: no agent socket for nodes {missing}")
        if not 1 <= channels <= 64:
            raise ValueError("channels: 1..64 (the wire carries a 64-bit mask)")
        if op_interval_s <= 0 or progress_every < 1:
            raise ValueError("op_interval_s must be > 0 and progress_every >= 1")
        if slow_rank is not None and slow_rank not in ranks:
            raise ValueError(f"slow_rank: {slow_rank} is not a rank of the job")
        self.job_id = job_id
        self.comm_id = comm_id
        self.channels = channels
        self.op_interval_s = op_interval_s
        self.progress_every = progress_every
        self.slow_rank = slow_rank
        self.max_ops = max_ops
        self.max_runtime_s = max_runtime_s
        self.connect_timeout_s = connect_timeout_s
        self._lib_path = lib_path
        self._ranks = [
            _Rank(
                log=RankLog(rank=r, node=n, gpu=g),
                plugin=Plugin(
                    socket_path=Path(sockets[n]),
                    rank=r,
                    comm_id=comm_id,
                    # As a launcher setting RAILOVER_JOB_ID would: the agent then sends the
                    # rank only its job's commands, though another job shares the node.
                    job_id=job_id,
                    reconnect_min_ms=10,
                    reconnect_max_ms=200,
                    lib_path=lib_path,
                ),
                slow_left=slow_commands if r == slow_rank else 0,
            )
            for r, n, g in sorted(placement)
        ]
        self._slots: list[SwitchVote] = [SwitchVote(0)] * len(self._ranks)
        self._barrier = threading.Barrier(len(self._ranks), action=self._gather)
        self._outcome = _Outcome(op=0, votes=None, stop=False)
        self._ops_done = 0
        self._progress = threading.Condition()
        self._stop_requested = threading.Event()
        self._abort_requested = threading.Event()
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._started_at = 0.0
        self.stop_reason: str | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Self:
        """Open every rank's plugin, wait until all are connected, then start the ops."""
        if self._threads:
            raise JobError("the job was already started")
        opened: list[_Rank] = []
        try:
            for st in self._ranks:
                st.plugin.init()
                opened.append(st)
            deadline = time.monotonic() + self.connect_timeout_s
            for st in self._ranks:
                # Early reports would wait in the plugin's ring, but commands only
                # come over a connection: a rank starts once the agent can reach it.
                while not st.plugin.stats().connected:
                    if time.monotonic() > deadline:
                        raise JobError(
                            f"rank {st.log.rank} could not reach the agent of "
                            f"{st.log.node} within {self.connect_timeout_s:g}s"
                        )
                    time.sleep(0.01)
        except BaseException:
            for st in opened:
                st.plugin.finalize()
            raise
        self._started_at = time.monotonic()
        self._threads = [
            threading.Thread(
                target=self._run_rank, args=(st,), name=f"rank{st.log.rank}", daemon=True
            )
            for st in self._ranks
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the job after the op in flight, close every plugin; raises a rank's error."""
        self._stop_requested.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            # A rank died outside the barrier: release the others rather than hang.
            self._barrier.abort()
            for t in self._threads:
                t.join(1.0)
        for st in self._ranks:
            st.plugin.finalize()
        with self._progress:
            self._progress.notify_all()
        if self._errors:
            raise JobError(f"{len(self._errors)} rank thread(s) failed") from self._errors[0]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- observation ---------------------------------------------------------------------------

    @property
    def ranks(self) -> list[int]:
        return [st.log.rank for st in self._ranks]

    @property
    def ops_done(self) -> int:
        """Collective ops every rank has completed."""
        return self._ops_done

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    @property
    def errors(self) -> list[BaseException]:
        return list(self._errors)

    def plugin(self, rank: int) -> Plugin:
        """A rank's plugin handle, to report as that rank's CCL would (reports are thread-safe)."""
        for st in self._ranks:
            if st.log.rank == rank:
                return st.plugin
        raise KeyError(rank)

    def log(self, rank: int) -> RankLog:
        """A snapshot of one rank's log."""
        for st in self._ranks:
            if st.log.rank == rank:
                src = st.log
                return RankLog(
                    rank=src.rank,
                    node=src.node,
                    gpu=src.gpu,
                    received=list(src.received),
                    applied=list(src.applied),
                    acks=list(src.acks),
                    failovers=list(src.failovers),
                    channel_weights=src.channel_weights,
                    split_ratio=src.split_ratio,
                    transit_gpu=src.transit_gpu,
                    transits=list(src.transits),
                    checkpoints=list(src.checkpoints),
                )
        raise KeyError(rank)

    def logs(self) -> dict[int, RankLog]:
        """Snapshots of every rank's log, by rank."""
        return {r: self.log(r) for r in self.ranks}

    def applied(self) -> dict[int, list[Applied]]:
        """Every rank's applications in order."""
        return {st.log.rank: list(st.log.applied) for st in self._ranks}

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Re-check ``predicate`` after every op until it holds or the job ends or time is up."""
        deadline = time.monotonic() + timeout_s
        with self._progress:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0 or (self._threads and not self.running):
                    return predicate()
                self._progress.wait(min(left, 0.1))
        return True

    def wait_ops(self, ops: int, timeout_s: float) -> bool:
        """Until every rank has completed ``ops`` collectives."""
        return self.wait(lambda: self._ops_done >= ops, timeout_s)

    # --- the ranks -----------------------------------------------------------------------------

    def _run_rank(self, st: _Rank) -> None:
        index = self._ranks.index(st)
        try:
            while True:
                self._take_commands(st)
                # The round is fused into this op: the rank acts on it at ops_done + 1.
                self._slots[index] = SwitchVote.of(st.ops_done + 1, st.armed)
                try:
                    self._barrier.wait()
                except threading.BrokenBarrierError:
                    break
                outcome = self._outcome
                st.ops_done = outcome.op
                self._settle(st, index, outcome)
                if st.ops_done % self.progress_every == 0:
                    st.plugin.report_progress(self.comm_id, st.log.rank, st.ops_done)
                if outcome.stop:
                    break
                time.sleep(self.op_interval_s)
            # A job that ends still answers the aborts it was sent (each rank its own).
            self._take_commands(st, final=True)
        except BaseException as exc:
            log.exception("rank %d failed", st.log.rank)
            self._errors.append(exc)
            self._barrier.abort()

    def _gather(self) -> None:
        """The barrier action (one thread, all others waiting): the AllGather of the votes."""
        op = self._ops_done + 1
        votes = Round(self._slots, self._lib_path) if any(v.epoch for v in self._slots) else None
        reason = None
        if self._abort_requested.is_set():
            reason = "aborted by the service"
        elif self._stop_requested.is_set():
            reason = "stopped"
        elif self.max_ops is not None and op >= self.max_ops:
            reason = f"reached max_ops {self.max_ops}"
        elif time.monotonic() - self._started_at > self.max_runtime_s:
            reason = f"ran for max_runtime_s {self.max_runtime_s:g}"
        if reason is not None:
            self.stop_reason = reason
        self._outcome = _Outcome(op=op, votes=votes, stop=reason is not None)
        with self._progress:
            self._ops_done = op
            self._progress.notify_all()

    def _settle(self, st: _Rank, index: int, outcome: _Outcome) -> None:
        """After the op's barrier: act on the round (each rank decides alone), then switch."""
        if outcome.votes is not None and st.armed is not None:
            verdict = outcome.votes.agree(index)
            if verdict.action == AgreeAction.COMMIT:
                st.decided, st.armed = st.armed, None
            elif verdict.action == AgreeAction.TOO_LATE:
                # Some rank cannot take it in time: the switch point goes by unused everywhere.
                self._ack(st, st.armed, AckStatus.TOO_LATE)
                st.armed = None
        decided = st.decided
        if decided is not None and decided.ops_done == st.ops_done:
            st.decided = None
            self._apply(st, decided)
        if st.armed is not None and st.armed.ops_done <= st.ops_done:
            # Rule 4 of the header never has to hold here: a round at every op decides by N.
            raise JobError(f"rank {st.log.rank}: epoch {st.armed.epoch} undecided at its op")

    def _take_commands(self, st: _Rank, *, final: bool = False) -> None:
        if st.parked:
            due = [c for c in st.parked if st.ops_done >= c.ops_done]
            st.parked = [c for c in st.parked if c not in due]
            for held in due:
                self._switch_command(st, held)
        while (cmd := st.plugin.poll_command_v2()) is not None:
            st.log.received.append(Received(st.ops_done, cmd))
            if cmd.command_id in st.seen:
                continue  # a redelivery after a reconnect: already handled
            st.seen.add(cmd.command_id)
            if final and cmd.kind != CommandKind.ABORT:
                continue
            self._on_command(st, cmd)

    def _on_command(self, st: _Rank, cmd: CclCommand) -> None:
        if cmd.comm_id not in (0, self.comm_id):
            self._ack(st, cmd, AckStatus.UNSUPPORTED)
        elif cmd.kind == CommandKind.ABORT:
            self._ack(st, cmd, AckStatus.APPLIED)
            self._abort_requested.set()
        elif cmd.kind == CommandKind.FAILOVER:
            st.log.failovers.append((st.ops_done, cmd))
            armed = st.armed
            if armed is not None and armed.kind == CommandKind.FAILBACK and armed.epoch < cmd.epoch:
                st.armed = None  # the failover overtakes a return still armed: stay put
            self._ack(st, cmd, AckStatus.APPLIED)
        elif cmd.kind == CommandKind.NVL_TRANSIT:
            mine = dict(cmd.transit).get(st.log.rank)
            if mine is not None:
                st.log.transit_gpu = mine
                st.log.transits.append((st.ops_done, mine))
            self._ack(st, cmd, AckStatus.APPLIED)
        elif cmd.kind == CommandKind.CHECKPOINT_NOW:
            # A training loop would save at its next iteration; the simulated one notes it.
            st.log.checkpoints.append((st.ops_done, cmd))
            self._ack(st, cmd, AckStatus.APPLIED)
        elif cmd.kind in SWITCH_KINDS:
            if st.slow_left > 0:
                st.slow_left -= 1
                st.parked.append(cmd)
            else:
                self._switch_command(st, cmd)
        else:
            self._ack(st, cmd, AckStatus.UNSUPPORTED)

    def _apply(self, st: _Rank, cmd: CclCommand) -> None:
        """Switch to the plan at this op, and say so."""
        st.log.applied.append(
            Applied(
                op=st.ops_done,
                epoch=cmd.epoch,
                kind=cmd.kind,
                disabled_channels=channels_of(cmd.disabled_channels),
                command_id=cmd.command_id,
                weights=cmd.weights,
                split_ratio=cmd.split_ratio,
            )
        )
        st.log.channel_weights, st.log.split_ratio = cmd.weights, cmd.split_ratio
        if cmd.kind == CommandKind.FAILBACK and st.log.transit_gpu is not None:
            st.log.transit_gpu = None
            st.log.transits.append((st.ops_done, None))
        self._ack(st, cmd, AckStatus.APPLIED)

    def _switch_command(self, st: _Rank, cmd: CclCommand) -> None:
        if cmd.disabled_channels >> self.channels:
            self._ack(st, cmd, AckStatus.FAILED)  # names channels this communicator lacks
        elif cmd.kind == CommandKind.BALANCE and len(cmd.weights) != self.channels:
            self._ack(st, cmd, AckStatus.FAILED)  # weights for another channel count
        elif cmd.ops_done == 0:
            # "Now": nothing to agree on in-band; the plan takes effect from this op.
            self._apply(st, cmd)
        elif cmd.ops_done <= st.ops_done:
            self._ack(st, cmd, AckStatus.TOO_LATE)
        elif st.armed is not None and st.armed.epoch > cmd.epoch:
            pass  # an older trigger arriving late; the service has superseded it
        else:
            st.armed = cmd  # a newer epoch replaces an older armed one

    def _ack(self, st: _Rank, cmd: CclCommand, status: AckStatus) -> None:
        # Every answer says how far the rank was: the service re-triggers beyond it.
        queued = st.plugin.ack_command_at(cmd.command_id, status, st.ops_done)
        st.log.acks.append(Ack(cmd.command_id, int(status), st.ops_done, queued))
        if not queued:
            log.warning(
                "rank %d: ack %s for command %d dropped by the plugin",
                st.log.rank,
                status.name,
                cmd.command_id,
            )
