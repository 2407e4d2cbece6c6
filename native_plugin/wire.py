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
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from enum import IntEnum
from typing import ClassVar, Final

__all__ = [
    "ABI_WITH_EXTENSIONS",
    "HEADER_SIZE",
    "HELLO_NCCL_PROFILER",
    "JOB_LEN",
    "LARGEST_COMMAND_PAYLOAD",
    "LARGEST_REPORT_PAYLOAD",
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
    "FrameDecoder",
    "Hello",
    "Message",
    "MsgType",
    "PathSwitch",
    "PortEvent",
    "Progress",
    "Stall",
    "SwitchReason",
    "WireError",
    "decode_frame",
    "encode",
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

_HEADER: Final = struct.Struct("<IHHII")
assert _HEADER.size == HEADER_SIZE


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

_CLASSES: Final[Mapping[MsgType, type[Message]]] = {
    cls.TYPE: cls
    for cls in (
        CqeError,
        PortEvent,
        PathSwitch,
        Progress,
        Hello,
        Communicator,
        Stall,
        Command,
        Ack,
        AckAt,
        CommandWeights,
        CommandTransit,
    )
}

_INT_RANGES: Final[Mapping[str, tuple[int, int]]] = {
    "Q": (0, 2**64 - 1),
    "I": (0, 2**32 - 1),
    "i": (-(2**31), 2**31 - 1),
}


_F32_MAX: Final = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]


def _field_shape(code: str) -> tuple[int, str]:
    """(entries, struct letter) of a layout code: "Q" is (1, "Q"), "64f" (64, "f"); for a
    name, "64s", (64, "s"): its size in bytes (it is one entry of the unpacked tuple)."""
    letter = code[-1]
    if len(code) == 1:
        return 1, letter
    return int(code[:-1]), letter


class _Codec:
    """Precomputed pack/unpack plan for one message type."""

    __slots__ = ("cls", "header", "names", "shapes", "struct", "version", "wire_fields")

    def __init__(
        self, msg_type: MsgType, layout: tuple[tuple[str, str], ...], version: int = MIN_VERSION
    ) -> None:
        self.cls = _CLASSES[msg_type]
        self.wire_fields = layout
        self.version = version
        self.struct = struct.Struct("<" + "".join(code for _, code in layout))
        self.header = _HEADER.pack(MAGIC, version, msg_type, self.struct.size, 0)
        # (name, entries, letter) per field in wire order; reserved ones included.
        self.shapes = tuple((name, *_field_shape(code)) for name, code in layout)
        self.names = tuple(name for name, _ in layout if name != "reserved")
        # An older layout holds the first fields; the later ones take their defaults.
        dataclass_names = tuple(f.name for f in fields(self.cls))
        assert dataclass_names[: len(self.names)] == self.names, (msg_type, self.names)
        assert all(f.default is not MISSING for f in fields(self.cls)[len(self.names) :]), msg_type

    def encode(self, msg: Message) -> bytes:
        values: list[int | float | bytes] = []
        for name, n, letter in self.shapes:
            if name == "reserved":
                values.append(0)
                continue
            value = getattr(msg, name)
            if letter == "s":
                values.append(_encode_name(name, value, n))
            elif n > 1:
                values.extend(
                    _encode_number(f"{type(msg).__name__}.{name}", letter, v) for v in value
                )
            else:
                values.append(_encode_number(f"{type(msg).__name__}.{name}", letter, value))
        return self.header + self.struct.pack(*values)

    def decode(self, buf: bytes | bytearray | memoryview, offset: int) -> Message:
        raw = self.struct.unpack_from(buf, offset)
        args: dict[str, object] = {}
        i = 0
        for name, n, letter in self.shapes:
            entries = 1 if letter == "s" else n
            chunk = raw[i : i + entries]
            i += entries
            if name == "reserved":
                continue
            if letter == "s":
                value = chunk[0]
                assert isinstance(value, bytes)
                # Bad UTF-8 (e.g. a name cut mid-character by a C sender) is not worth
                # dropping the connection over; it shows up as U+FFFD instead.
                args[name] = value.split(b"\0", 1)[0].decode("utf-8", "replace")
            else:
                args[name] = tuple(chunk) if n > 1 else chunk[0]
        # The dict holds exactly the dataclass's fields; __init__ asserts the names agree.
        return self.cls(**args)  # type: ignore[arg-type]  # values follow the layout's codes


def _encode_number(what: str, letter: str, value: object) -> int | float:
    if letter == "f":
        # A float field takes any number a binary32 holds; NaN and infinities are for
        # tests of the receiver to write by hand, not for this encoder.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WireError(f"{what}={value!r} is not a number")
        x = float(value)
        if not math.isfinite(x) or abs(x) > _F32_MAX:
            raise WireError(f"{what}={value!r} is not a finite binary32")
        return x
    lo, hi = _INT_RANGES[letter]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise WireError(f"{what}={value!r} is not an integer in [{lo}, {hi}]")
    return value


def _encode_name(name: str, value: object, size: int) -> bytes:
    if not isinstance(value, str):
        raise WireError(f"{name}={value!r} is not a str")
    raw = value.encode("utf-8")
    if b"\0" in raw:
        raise WireError(f"{name}={value!r} contains NUL")
    if len(raw) >= size:
        raise WireError(f"{name} is {len(raw)} bytes of UTF-8; at most {size - 1} fit")
    return raw


# Version-1 layouts, by type: every frame but a Hello naming a job is written with these.
_CODECS: Final[Mapping[int, _Codec]] = {
    t: _Codec(t, layout) for t, layout in PAYLOAD_LAYOUT.items()
}
_CODECS_V2: Final[Mapping[int, _Codec]] = {
    t: _Codec(MsgType(t), PAYLOAD_LAYOUT_V2[MsgType(t)], 2) if t in PAYLOAD_LAYOUT_V2 else c
    for t, c in _CODECS.items()
}
# What a frame of each version is decoded with, by (version, type).
_DECODERS: Final[Mapping[tuple[int, int], _Codec]] = {
    (v, t): c for v, table in ((1, _CODECS), (2, _CODECS_V2)) for t, c in table.items()
}
_CODEC_BY_CLASS: Final[Mapping[type[Message], _Codec]] = {c.cls: c for c in _CODECS.values()}

assert max(c.struct.size for c in _DECODERS.values()) <= MAX_PAYLOAD
# RAILOVER_WIRE_LARGEST_V1_PAYLOAD (plugin -> agent, the plugin's ring slots) and
# RAILOVER_WIRE_LARGEST_V1_COMMAND_PAYLOAD (agent -> plugin).
LARGEST_REPORT_PAYLOAD: Final = max(c.struct.size for t, c in _CODECS.items() if t not in TO_PLUGIN)
LARGEST_COMMAND_PAYLOAD: Final = max(c.struct.size for t, c in _CODECS.items() if t in TO_PLUGIN)


def encode(msg: Message) -> bytes:
    """One complete frame (header + payload) for ``msg``, at the lowest version that holds
    it (a ``Hello`` naming a job: 2; everything else: 1); ``WireError`` if a field won't fit."""
    codec = _CODEC_BY_CLASS.get(type(msg))
    if codec is None:
        raise WireError(f"{type(msg).__name__} is not a wire message")
    if isinstance(msg, Hello) and msg.job:
        codec = _CODECS_V2[MsgType.HELLO]
    return codec.encode(msg)


def _check_header(magic: int, version: int, msg_type: int, payload_len: int) -> _Codec:
    if magic != MAGIC:
        raise WireError(f"bad magic 0x{magic:08X}, expected 0x{MAGIC:08X}")
    if not MIN_VERSION <= version <= VERSION:
        raise WireError(f"unsupported version {version}, expected {MIN_VERSION} to {VERSION}")
    if payload_len > MAX_PAYLOAD:
        raise WireError(f"payload_len {payload_len} exceeds the maximum {MAX_PAYLOAD}")
    codec = _DECODERS.get((version, msg_type))
    if codec is None:
        raise WireError(f"unknown message type {msg_type}")
    if payload_len != codec.struct.size:
        raise WireError(
            f"payload_len {payload_len} does not match {MsgType(msg_type).name} "
            f"({codec.struct.size} bytes at version {version})"
        )
    return codec


def decode_frame(frame: bytes) -> Message:
    """Decode exactly one complete frame; raises ``WireError`` otherwise."""
    if len(frame) < HEADER_SIZE:
        raise WireError(
            f"frame of {len(frame)} bytes is shorter than the {HEADER_SIZE}-byte header"
        )
    magic, version, msg_type, payload_len, _ = _HEADER.unpack_from(frame, 0)
    codec = _check_header(magic, version, msg_type, payload_len)
    if len(frame) != HEADER_SIZE + payload_len:
        raise WireError(f"frame is {len(frame)} bytes, header says {HEADER_SIZE + payload_len}")
    return codec.decode(frame, HEADER_SIZE)


class FrameDecoder:
    """Incremental decoder for one connection's byte stream.

    Keeps at most one incomplete frame (< ``HEADER_SIZE + MAX_PAYLOAD`` bytes) between
    calls: a header is validated as soon as its 16 bytes are in, before any payload is
    awaited. After a ``WireError`` the decoder stays failed; drop the connection.
    """

    __slots__ = ("_buf", "_failed")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._failed: str | None = None

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held until more data arrives."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message]:
        """Add received bytes; return every message now complete, in order."""
        if self._failed is not None:
            raise WireError(f"decoder already failed: {self._failed}")
        buf = self._buf
        buf += data
        out: list[Message] = []
        pos = 0
        end = len(buf)
        try:
            while end - pos >= HEADER_SIZE:
                magic, version, msg_type, payload_len, _ = _HEADER.unpack_from(buf, pos)
                codec = _check_header(magic, version, msg_type, payload_len)
                if end - pos - HEADER_SIZE < payload_len:
                    break
                out.append(codec.decode(buf, pos + HEADER_SIZE))
                pos += HEADER_SIZE + payload_len
        except WireError as exc:
            self._failed = str(exc)
            buf.clear()
            raise WireError(str(exc), out) from None
        del buf[:pos]
        return out
