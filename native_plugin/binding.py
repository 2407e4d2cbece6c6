"""Typed ctypes binding of ``librailover_plugin.so`` (ABI v3), for tests and simulated ranks.

The names follow the C table ``railoverPlugin_v3`` in ``include/railover_plugin.h`` (every
call of ``railoverPlugin_v1``, ``poll_command_v2``, and ``init_v3``, which names the job)::

    with Plugin(socket_path="/run/railover/agent.sock", rank=0, comm_id=7, job_id="llm") as plugin:
        plugin.report_progress(7, 0, ops_done)
        cmd = plugin.poll_command()
        if cmd is not None:
            plugin.ack_command(cmd.command_id, AckStatus.APPLIED)

``Plugin(abi=1)`` or ``abi=2`` initialises through that older table's ``init``, as a CCL
built against its header does: the job then comes from ``RAILOVER_JOB_ID`` only.
``poll_command`` is the ABI 1 view a CCL built against the older header gets (a BALANCE
comes out as a REBALANCE; an NVL_TRANSIT is answered UNSUPPORTED by the library);
``poll_command_v2`` returns a ``CclCommand`` with the weights and transit GPUs.

Report calls return ``True`` when queued and ``False`` when dropped (counted in
``stats()``); only real errors raise ``PluginError``. Integer arguments are converted by
ctypes to the C widths (u32/u64), so out-of-range values wrap as they would in C.
``agree()`` and ``Round`` are the library's pure switch-point decision (see "Switch
points" in the header); they need no handle. The C side under them (the status codes,
the structs, the function tables, ``load_library``, ``PluginError``) is
``native_plugin.abi``.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from enum import IntEnum
from types import TracebackType
from typing import Final, Self

from native_plugin.abi import (
    ABI_VERSION,
    LOG_FN,
    NO_COMMAND,
    OK,
    PluginError,
    RailoverAgreement,
    RailoverCommand,
    RailoverCommandV2,
    RailoverConfig,
    RailoverConfigV3,
    RailoverStats,
    RailoverSwitchVote,
    Stats,
    Status,
    load_library,
)
from native_plugin.wire import MAX_CHANNELS, MAX_TRANSIT, RANK_UNKNOWN, AckStatus, Command

__all__ = [
    "AckStatus",
    "AgreeAction",
    "AgreeOutcome",
    "Agreement",
    "CclCommand",
    "LogFn",
    "Plugin",
    "Round",
    "SwitchVote",
    "agree",
]

LogFn = Callable[[int, str], None]
_logger = logging.getLogger("railover.native_plugin")
_LEVELS: Final = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG}


@dataclass(frozen=True, slots=True, kw_only=True)
class CclCommand:
    """``railover_command_v2_t``: a command with its balance or transit payload.

    ``weights`` holds the ``n_channels`` weights (empty unless BALANCE); ``transit``
    maps rank -> transit GPU (empty unless NVL_TRANSIT).
    """

    command_id: int
    comm_id: int
    ops_done: int
    disabled_channels: int
    kind: int
    epoch: int
    split_ratio: float = 0.0
    weights: tuple[float, ...] = ()
    mb_per_channel: int = 0
    transit: tuple[tuple[int, int], ...] = ()
    iteration: int = 0  # CHECKPOINT_NOW: the iteration that could not be rebuilt


class AgreeOutcome(IntEnum):
    """``railover_agree_outcome_t``: what a round decided, the same on every rank."""

    NONE = 0
    WAIT = 1
    APPLY = 2
    REJECT = 3


class AgreeAction(IntEnum):
    """``railover_agree_action_t``: what the calling rank does with the command it voted."""

    KEEP = 0
    COMMIT = 1
    TOO_LATE = 2


@dataclass(frozen=True, slots=True)
class SwitchVote:
    """``railover_switch_vote_t``: one rank's contribution to an agreement round.

    All but ``ops_done`` are 0 when the rank has nothing armed.
    """

    ops_done: int
    switch_at: int = 0
    disabled_channels: int = 0
    epoch: int = 0
    kind: int = 0

    @classmethod
    def of(cls, ops_done: int, armed: Command | CclCommand | None) -> SwitchVote:
        """The vote of a rank at ``ops_done`` with ``armed`` (or nothing) armed."""
        if armed is None:
            return cls(ops_done)
        return cls(ops_done, armed.ops_done, armed.disabled_channels, armed.epoch, armed.kind)


@dataclass(frozen=True, slots=True)
class Agreement:
    """``railover_agreement_t``: the outcome of one round and the caller's action."""

    outcome: AgreeOutcome
    action: AgreeAction
    epoch: int
    switch_at: int
    max_ops_done: int


# Every initialised plugin, held strongly until finalize. The C sender thread calls
# the handle's ctypes log callback, which lives on the Plugin object: if a Plugin
# nobody references any more were collected while its handle still ran, the
# thread would call freed memory (seen as a segfault when a simulated job was
# dropped without stop()). Holding it here keeps the callback alive; it is also
# how plugins still open at interpreter exit are finalized before teardown.
_open_plugins: set[Plugin] = set()


@atexit.register
def _finalize_open_plugins() -> None:
    for plugin in list(_open_plugins):
        plugin.finalize()


class Round:
    """The gathered votes of one agreement round, in rank order, packed once for C.

    Every rank then calls ``agree(its index)`` on the same round; the calls only read
    the votes, so they may run on many threads at once.
    """

    __slots__ = ("_api", "_votes", "size")

    def __init__(
        self, votes: Sequence[SwitchVote], lib_path: str | os.PathLike[str] | None = None
    ) -> None:
        if not votes:
            raise PluginError("agree (a round needs at least one vote)", Status.ERR_INVALID)
        self._api = load_library(lib_path)
        self.size = len(votes)
        self._votes = (RailoverSwitchVote * self.size)(
            *(
                RailoverSwitchVote(v.ops_done, v.switch_at, v.disabled_channels, v.epoch, v.kind)
                for v in votes
            )
        )

    def agree(self, self_index: int) -> Agreement:
        """The library's ``agree()``: the round's outcome and this rank's action."""
        out = RailoverAgreement()
        rc = self._api.agree(self._votes, self.size, self_index, ctypes.byref(out))
        if rc != OK:
            raise PluginError("agree", rc)
        return Agreement(
            outcome=AgreeOutcome(out.outcome),
            action=AgreeAction(out.action),
            epoch=out.epoch,
            switch_at=out.switch_at,
            max_ops_done=out.max_ops_done,
        )


def agree(
    votes: Sequence[SwitchVote], self_index: int, lib_path: str | os.PathLike[str] | None = None
) -> Agreement:
    """One agreement round: the library's ``agree()`` over every rank's vote, in rank order."""
    return Round(votes, lib_path).agree(self_index)


def _default_log(level: int, message: str) -> None:
    _logger.log(_LEVELS.get(level, logging.INFO), "%s", message)


class Plugin:
    """One plugin handle (``init`` … ``finalize``); a context manager.

    Config arguments mirror ``railover_config_v3_t``: ``None``/0 means the
    ``RAILOVER_PLUGIN_*`` (``RAILOVER_JOB_*`` for the job) environment variable, else the
    library default. ``abi`` picks the table whose ``init`` is called: 3 (``init_v3``, with
    ``job_id`` and ``incarnation``), or 1 or 2, as a CCL built against that header would
    (the job then only from the environment; ``job_id`` and ``incarnation`` must be unset).
    """

    def __init__(
        self,
        *,
        socket_path: str | os.PathLike[str] | None = None,
        ring_size: int = 0,
        rank: int = RANK_UNKNOWN,
        comm_id: int = 0,
        reconnect_min_ms: int = 0,
        reconnect_max_ms: int = 0,
        log_interval_ms: int = 0,
        drain_timeout_ms: int = 0,
        job_id: str | None = None,
        incarnation: int = 0,
        abi: int = ABI_VERSION,
        log: LogFn | None = _default_log,
        lib_path: str | os.PathLike[str] | None = None,
    ) -> None:
        if abi not in (1, 2, ABI_VERSION):
            raise PluginError(f"abi {abi} (this binding knows 1 to {ABI_VERSION})", -1)
        if abi < ABI_VERSION and (job_id is not None or incarnation):
            raise PluginError(f"job_id and incarnation need init_v3 (abi {ABI_VERSION})", -1)
        self._api = load_library(lib_path)
        self._abi = abi
        self._socket_path = os.fsencode(socket_path) if socket_path is not None else None
        self._job_id = job_id.encode() if job_id is not None else None
        self._config = RailoverConfigV3(
            base=RailoverConfig(
                socket_path=self._socket_path,
                ring_size=ring_size,
                rank=rank,
                comm_id=comm_id,
                reconnect_min_ms=reconnect_min_ms,
                reconnect_max_ms=reconnect_max_ms,
                log_interval_ms=log_interval_ms,
                drain_timeout_ms=drain_timeout_ms,
            ),
            job_id=self._job_id,
            incarnation=incarnation,
        )
        self._log_cb = LOG_FN(self._make_log(log)) if log is not None else LOG_FN()
        self._handle: int | None = None
        self._lock = threading.Lock()  # init/finalize only; reports never take it

    @staticmethod
    def _make_log(log: LogFn) -> Callable[[int, bytes | None], None]:
        def trampoline(level: int, message: bytes | None) -> None:
            # An exception cannot cross back into C; report it and go on.
            try:
                log(level, (message or b"").decode("utf-8", "replace"))
            except Exception:
                _logger.exception("railover plugin log callback failed")

        return trampoline

    # --- lifecycle ---

    def init(self) -> None:
        """``init``: allocate the ring and start connecting in the background."""
        with self._lock:
            if self._handle is not None:
                raise PluginError("init (already initialised)", Status.ERR_INVALID)
            handle = ctypes.c_void_p()
            if self._abi == ABI_VERSION:
                rc = self._api.init_v3(
                    ctypes.byref(self._config),
                    ctypes.sizeof(self._config),
                    self._log_cb,
                    ctypes.byref(handle),
                )
            else:  # every table's init is one function: the job from the environment
                rc = self._api.init(
                    ctypes.byref(self._config.base), self._log_cb, ctypes.byref(handle)
                )
            if rc != OK:
                raise PluginError("init", rc)
            self._handle = handle.value
            _open_plugins.add(self)

    def finalize(self) -> None:
        """``finalize``: drain (bounded), disconnect, free. Idempotent."""
        with self._lock:
            if self._handle is None:
                return
            handle, self._handle = self._handle, None
            _open_plugins.discard(self)
            rc = self._api.finalize(handle)
            if rc != OK:
                raise PluginError("finalize", rc)

    def __enter__(self) -> Self:
        self.init()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finalize()

    @property
    def handle(self) -> int:
        """The C handle; raises if not initialised."""
        if self._handle is None:
            raise PluginError("call on a plugin that is not initialised", Status.ERR_INVALID)
        return self._handle

    # --- calls ---

    @staticmethod
    def _queued(call: str, rc: int) -> bool:
        if rc < 0:
            raise PluginError(call, rc)
        return rc == OK

    def report_cqe_error(  # noqa: PLR0917  # keeps the C call's argument order
        self,
        dev_name: str,
        port: int,
        qp_num: int,
        wc_status: int,
        vendor_err: int = 0,
        peer: str = "",
    ) -> bool:
        """A work completion failed; ``False`` if the report was dropped."""
        rc = self._api.report_cqe_error(
            self.handle, dev_name.encode(), port, qp_num, wc_status, vendor_err, peer.encode()
        )
        return self._queued("report_cqe_error", rc)

    def report_port_event(self, dev_name: str, port: int, ibv_event_type: int) -> bool:
        """An ibverbs async event on a port; ``False`` if dropped."""
        rc = self._api.report_port_event(self.handle, dev_name.encode(), port, ibv_event_type)
        return self._queued("report_port_event", rc)

    def report_path_switch(
        self, comm_id: int, channel: int, from_dev: str, to_dev: str, reason: int
    ) -> bool:
        """A channel moved to another RNIC; ``False`` if dropped."""
        rc = self._api.report_path_switch(
            self.handle, comm_id, channel, from_dev.encode(), to_dev.encode(), reason
        )
        return self._queued("report_path_switch", rc)

    def report_progress(self, comm_id: int, rank: int, ops_done: int) -> bool:
        """Collective operations completed by a rank; ``False`` if dropped."""
        return self._queued(
            "report_progress", self._api.report_progress(self.handle, comm_id, rank, ops_done)
        )

    def poll_command(self) -> Command | None:
        """The oldest pending command, or ``None`` at once when there is none.

        ``iteration`` is 0 even for CHECKPOINT_NOW: v1's ``railover_command_t`` has no
        field for it; ``poll_command_v2`` hands it out.
        """
        out = RailoverCommand()
        rc = self._api.poll_command(self.handle, ctypes.byref(out))
        if rc == NO_COMMAND:
            return None
        if rc != OK:
            raise PluginError("poll_command", rc)
        return Command(
            command_id=out.command_id,
            comm_id=out.comm_id,
            ops_done=out.ops_done,
            disabled_channels=out.disabled_channels,
            kind=out.kind,
            epoch=out.epoch,
        )

    def poll_command_v2(self) -> CclCommand | None:
        """The oldest pending command of any kind, with its weights or transit GPUs."""
        out = RailoverCommandV2()
        rc = self._api.poll_command_v2(self.handle, ctypes.byref(out), ctypes.sizeof(out))
        if rc == NO_COMMAND:
            return None
        if rc != OK:
            raise PluginError("poll_command_v2", rc)
        b = out.base
        n_w = min(out.n_channels, MAX_CHANNELS)
        n_t = min(out.n_transit, MAX_TRANSIT)
        return CclCommand(
            command_id=b.command_id,
            comm_id=b.comm_id,
            ops_done=b.ops_done,
            disabled_channels=b.disabled_channels,
            kind=b.kind,
            epoch=b.epoch,
            split_ratio=out.split_ratio,
            weights=tuple(out.weights[:n_w]),
            mb_per_channel=out.mb_per_channel,
            transit=tuple(zip(out.transit_ranks[:n_t], out.transit_gpus[:n_t], strict=True)),
            iteration=out.iteration,
        )

    def ack_command(self, command_id: int, status: int = AckStatus.APPLIED) -> bool:
        """Answer a command (0 applied, negative failed); ``False`` if the ACK was dropped."""
        return self._queued("ack_command", self._api.ack_command(self.handle, command_id, status))

    def ack_command_at(self, command_id: int, status: int, ops_done: int) -> bool:
        """Answer a command and say this rank's ops_done then; ``False`` if dropped."""
        rc = self._api.ack_command_at(self.handle, command_id, status, ops_done)
        return self._queued("ack_command_at", rc)

    def stats(self) -> Stats:
        """A snapshot of the counters."""
        out = RailoverStats()
        rc = self._api.stats(self.handle, ctypes.byref(out), ctypes.sizeof(out))
        if rc != OK:
            raise PluginError("stats", rc)
        return Stats(*(getattr(out, f.name) for f in fields(Stats)))
