"""Python mirror of ``native_plugin/include/railover_wire.h``: the plugin ↔ agent frame format.

The C header is the definition; this module must agree with it byte for byte, which
``tests/native_plugin/test_plugin_wire_agreement.py`` checks by compiling against the header.

A frame is a 16-byte little-endian header (magic, version, type, payload_len, reserved)
followed by a fixed-layout little-endian payload whose length is fixed per type and
version. Dataclass fields appear in wire order; reserved fields are not exposed (written
as 0, ignored when read). Names (``dev_name``, ``peer``, ...) are ``str``: UTF-8, at most
63 bytes, no NUL; a HELLO's ``job`` at most 255.

Versions: ``decode_frame`` and ``FrameDecoder`` take versions ``MIN_VERSION`` to
``VERSION``. Version 2 changed only HELLO's payload (``PAYLOAD_LAYOUT_V2``: the job the
process belongs to); ``encode`` writes every frame at the lowest version that holds it,
so a ``Hello`` naming a job goes as version 2 and everything else as version 1, which
receivers of either version read.

This module is the format: its constants, types and messages, and the payload layouts.
Turning messages into frames and back is ``native_plugin.wire_codec``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Final

__all__ = [
    "ABI_WITH_EXTENSIONS",
    "HEADER_SIZE",
    "HELLO_NCCL_PROFILER",
    "JOB_LEN",
    "MAGIC",
    "MAX_CHANNELS",
    "MAX_PAYLOAD",
    "MAX_TRANSIT",
    "MIN_VERSION",
    "NAME_LEN",
    "PAYLOAD_LAYOUT",
    "PAYLOAD_LAYOUT_V2",
    "RANK_UNKNOWN",
    "TO_PLUGIN",
    "VERSION",
    "Ack",
    "AckAt",
    "AckStatus",
    "Command",
    "CommandKind",
    "CommandTransit",
    "CommandWeights",
    "Communicator",
    "CqeError",
    "Hello",
    "Message",
    "MsgType",
    "PathSwitch",
    "PortEvent",
    "Progress",
    "Stall",
    "SwitchReason",
    "WireError",
]

MAGIC: Final = 0x52564C52
VERSION: Final = 2  # the newest; RAILOVER_WIRE_VERSION
MIN_VERSION: Final = 1  # the oldest a receiver takes; RAILOVER_WIRE_VERSION_MIN
HEADER_SIZE: Final = 16
MAX_PAYLOAD: Final = 1024
NAME_LEN: Final = 64
JOB_LEN: Final = 256  # RAILOVER_WIRE_JOB_LEN: Hello.job, at most 255 bytes
RANK_UNKNOWN: Final = 0xFFFFFFFF
# Hello.abi_version of the NCCL profiler plugin, which reads no commands.
HELLO_NCCL_PROFILER: Final = 0x4E43
# The first plugin ABI that reads COMMAND_WEIGHTS / COMMAND_TRANSIT (BALANCE, NVL_TRANSIT).
ABI_WITH_EXTENSIONS: Final = 2
MAX_CHANNELS: Final = 64  # RAILOVER_WIRE_MAX_CHANNELS
MAX_TRANSIT: Final = 16  # RAILOVER_WIRE_MAX_TRANSIT


class WireError(ValueError):
    """A frame is malformed; the connection it came from must be dropped.

    ``decoded`` holds the valid messages that preceded the bad frame in the same
    ``feed`` call, so a listener can still act on them before closing.
    """

    def __init__(self, message: str, decoded: list[Message] | None = None) -> None:
        super().__init__(message)
        self.decoded: list[Message] = decoded if decoded is not None else []


class MsgType(IntEnum):
    """Frame types (``enum railover_wire_type``); only ever appended."""

    CQE_ERROR = 1
    PORT_EVENT = 2
    PATH_SWITCH = 3
    PROGRESS = 4
    HELLO = 5
    COMMUNICATOR = 6
    STALL = 7
    COMMAND = 16
    ACK = 17
    ACK_AT = 18
    COMMAND_WEIGHTS = 19
    COMMAND_TRANSIT = 20


class CommandKind(IntEnum):
    """``Command.kind`` values; the field stays an ``int`` because the set only grows."""

    REBALANCE = 1
    FAILBACK = 2
    ABORT = 3
    FAILOVER = 4
    CHECKPOINT_NOW = 5  # FlowCheck: checkpoint at the next iteration; ``iteration`` is set
    BALANCE = 6
    NVL_TRANSIT = 7


class SwitchReason(IntEnum):
    """``PathSwitch.reason`` values; the field stays an ``int``."""

    OTHER = 0
    FAILOVER = 1
    FAILBACK = 2
    REBALANCE = 3
    NVL = 4


class AckStatus(IntEnum):
    """``Ack.status`` values: 0 applied, negative failed; the field stays an ``int``."""

    APPLIED = 0
    FAILED = -1
    UNSUPPORTED = -2
    TOO_LATE = -3
    BUSY = -4


@dataclass(frozen=True, slots=True, kw_only=True)
class CqeError:
    """A work completion with an error status (plugin → agent)."""

    TYPE: ClassVar[MsgType] = MsgType.CQE_ERROR
    timestamp_ns: int
    port: int
    qp_num: int
    wc_status: int
    vendor_err: int
    pid: int
    dev_name: str
    peer: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PortEvent:
    """An ibverbs async event on an RNIC port (plugin → agent)."""

    TYPE: ClassVar[MsgType] = MsgType.PORT_EVENT
    timestamp_ns: int
    port: int
    ibv_event_type: int
    pid: int
    dev_name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PathSwitch:
    """A channel of a communicator moved to another RNIC (plugin → agent)."""

    TYPE: ClassVar[MsgType] = MsgType.PATH_SWITCH
    comm_id: int
    timestamp_ns: int
    channel: int
    reason: int
    pid: int
    from_dev: str
    to_dev: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """Collective operations completed by one rank (plugin → agent)."""

    TYPE: ClassVar[MsgType] = MsgType.PROGRESS
    comm_id: int
    ops_done: int
    timestamp_ns: int
    rank: int
    pid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    """First frame of every plugin connection (plugin → agent).

    ``job`` is the job the process belongs to ("" names none: the version-1 frame, as every
    plugin before version 2 sends); ``incarnation`` the job's incarnation, 0 when not
    known (the version-1 ``reserved`` slot, always 0 before).
    """

    TYPE: ClassVar[MsgType] = MsgType.HELLO
    comm_id: int
    pid: int
    abi_version: int
    rank: int
    incarnation: int = 0
    job: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """An order for the CCL (agent → plugin); ``ops_done`` 0 means apply now."""

    TYPE: ClassVar[MsgType] = MsgType.COMMAND
    command_id: int
    comm_id: int
    ops_done: int
    disabled_channels: int
    kind: int
    epoch: int
    # CHECKPOINT_NOW: the iteration a checkpoint node could not rebuild; 0 otherwise
    # (the v1 ``reserved`` slot, always 0 before kind 5).
    iteration: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    """The CCL's answer to a ``Command`` (plugin → agent)."""

    TYPE: ClassVar[MsgType] = MsgType.ACK
    command_id: int
    status: int
    pid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Communicator:
    """A CCL communicator the process joined (NCCL profiler plugin → agent)."""

    TYPE: ClassVar[MsgType] = MsgType.COMMUNICATOR
    comm_id: int
    timestamp_ns: int
    rank: int
    nranks: int
    n_nodes: int
    pid: int
    host: str
    job: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Stall:
    """A collective open for the stall time, reported once (NCCL profiler plugin → agent)."""

    TYPE: ClassVar[MsgType] = MsgType.STALL
    comm_id: int
    seq_number: int
    timestamp_ns: int
    open_ns: int
    rank: int
    pid: int
    func: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AckAt:
    """An answer that also says how far the rank was (plugin → agent, ``ack_command_at``).

    ``ops_done`` is the rank's count of completed collectives on the command's
    communicator when it answered: the op it switched at for ``APPLIED``, how far
    past the switch point it already was for ``TOO_LATE``.
    """

    TYPE: ClassVar[MsgType] = MsgType.ACK_AT
    command_id: int
    status: int
    pid: int
    ops_done: int


def _padded(values: tuple[float, ...] | tuple[int, ...], n: int, what: str) -> tuple[object, ...]:
    if len(values) > n:
        raise WireError(f"{what} has {len(values)} entries; at most {n} fit")
    return tuple(values) + (0,) * (n - len(values))


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandWeights:
    """R²CCL-Balance for the BALANCE ``Command`` it follows (agent → plugin).

    ``weights`` holds all ``MAX_CHANNELS`` entries on the wire; give the first
    ``n_channels`` and the rest are filled with 0. Use ``of`` to build one.
    """

    TYPE: ClassVar[MsgType] = MsgType.COMMAND_WEIGHTS
    command_id: int
    n_channels: int
    split_ratio: float
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        padded = _padded(tuple(self.weights), MAX_CHANNELS, "weights")
        object.__setattr__(self, "weights", tuple(float(w) for w in padded))  # type: ignore[arg-type]  # _padded returns numbers

    @classmethod
    def of(cls, command_id: int, weights: Sequence[float], split_ratio: float) -> CommandWeights:
        return cls(
            command_id=command_id,
            n_channels=len(weights),
            split_ratio=split_ratio,
            weights=tuple(weights),
        )

    @property
    def used(self) -> tuple[float, ...]:
        """The weights of the ``n_channels`` channels."""
        return self.weights[: min(self.n_channels, MAX_CHANNELS)]


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandTransit:
    """NVL transit for the NVL_TRANSIT ``Command`` it follows (agent → plugin).

    ``ranks[i]`` sends through node-local GPU ``transit_gpus[i]``; both arrays hold
    ``MAX_TRANSIT`` entries on the wire (filled with 0). Use ``of`` to build one.
    """

    TYPE: ClassVar[MsgType] = MsgType.COMMAND_TRANSIT
    command_id: int
    n_ranks: int
    mb_per_channel: int
    ranks: tuple[int, ...]
    transit_gpus: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", _padded(tuple(self.ranks), MAX_TRANSIT, "ranks"))
        gpus = _padded(tuple(self.transit_gpus), MAX_TRANSIT, "transit_gpus")
        object.__setattr__(self, "transit_gpus", gpus)

    @classmethod
    def of(cls, command_id: int, transit: Mapping[int, int], mb_per_channel: int) -> CommandTransit:
        """``transit`` maps rank -> transit GPU, written in rank order."""
        order = sorted(transit)
        return cls(
            command_id=command_id,
            n_ranks=len(order),
            mb_per_channel=mb_per_channel,
            ranks=tuple(order),
            transit_gpus=tuple(transit[r] for r in order),
        )

    @property
    def used(self) -> dict[int, int]:
        """rank -> transit GPU for the ``n_ranks`` entries."""
        n = min(self.n_ranks, MAX_TRANSIT)
        return dict(zip(self.ranks[:n], self.transit_gpus[:n], strict=True))


Message = (
    CqeError
    | PortEvent
    | PathSwitch
    | Progress
    | Hello
    | Communicator
    | Stall
    | Command
    | Ack
    | AckAt
    | CommandWeights
    | CommandTransit
)

# Payload layouts in wire order, as (field name, struct code). "reserved" fields are
# padding to 8-byte alignment, matching the C structs field for field.
PAYLOAD_LAYOUT: Final[Mapping[MsgType, tuple[tuple[str, str], ...]]] = {
    MsgType.CQE_ERROR: (
        ("timestamp_ns", "Q"),
        ("port", "I"),
        ("qp_num", "I"),
        ("wc_status", "I"),
        ("vendor_err", "I"),
        ("pid", "I"),
        ("reserved", "I"),
        ("dev_name", "64s"),
        ("peer", "64s"),
    ),
    MsgType.PORT_EVENT: (
        ("timestamp_ns", "Q"),
        ("port", "I"),
        ("ibv_event_type", "I"),
        ("pid", "I"),
        ("reserved", "I"),
        ("dev_name", "64s"),
    ),
    MsgType.PATH_SWITCH: (
        ("comm_id", "Q"),
        ("timestamp_ns", "Q"),
        ("channel", "I"),
        ("reason", "I"),
        ("pid", "I"),
        ("reserved", "I"),
        ("from_dev", "64s"),
        ("to_dev", "64s"),
    ),
    MsgType.PROGRESS: (
        ("comm_id", "Q"),
        ("ops_done", "Q"),
        ("timestamp_ns", "Q"),
        ("rank", "I"),
        ("pid", "I"),
    ),
    MsgType.HELLO: (
        ("comm_id", "Q"),
        ("pid", "I"),
        ("abi_version", "I"),
        ("rank", "I"),
        ("incarnation", "I"),
    ),
    MsgType.COMMUNICATOR: (
        ("comm_id", "Q"),
        ("timestamp_ns", "Q"),
        ("rank", "I"),
        ("nranks", "I"),
        ("n_nodes", "I"),
        ("pid", "I"),
        ("host", "64s"),
        ("job", "64s"),
    ),
    MsgType.STALL: (
        ("comm_id", "Q"),
        ("seq_number", "Q"),
        ("timestamp_ns", "Q"),
        ("open_ns", "Q"),
        ("rank", "I"),
        ("pid", "I"),
        ("func", "64s"),
    ),
    MsgType.COMMAND: (
        ("command_id", "Q"),
        ("comm_id", "Q"),
        ("ops_done", "Q"),
        ("disabled_channels", "Q"),
        ("kind", "I"),
        ("epoch", "I"),
        ("iteration", "Q"),
    ),
    MsgType.ACK: (
        ("command_id", "Q"),
        ("status", "i"),
        ("pid", "I"),
    ),
    MsgType.ACK_AT: (
        ("command_id", "Q"),
        ("status", "i"),
        ("pid", "I"),
        ("ops_done", "Q"),
    ),
    MsgType.COMMAND_WEIGHTS: (
        ("command_id", "Q"),
        ("n_channels", "I"),
        ("split_ratio", "f"),
        ("weights", f"{MAX_CHANNELS}f"),
    ),
    MsgType.COMMAND_TRANSIT: (
        ("command_id", "Q"),
        ("n_ranks", "I"),
        ("mb_per_channel", "I"),
        ("ranks", f"{MAX_TRANSIT}I"),
        ("transit_gpus", f"{MAX_TRANSIT}I"),
    ),
}

# The payloads version 2 changed; every other type's is PAYLOAD_LAYOUT's at version 2 too.
PAYLOAD_LAYOUT_V2: Final[Mapping[MsgType, tuple[tuple[str, str], ...]]] = {
    MsgType.HELLO: (*PAYLOAD_LAYOUT[MsgType.HELLO], ("job", f"{JOB_LEN}s")),
}

# Frames the agent sends; every other type goes plugin -> agent.
TO_PLUGIN: Final = frozenset({MsgType.COMMAND, MsgType.COMMAND_WEIGHTS, MsgType.COMMAND_TRANSIT})
