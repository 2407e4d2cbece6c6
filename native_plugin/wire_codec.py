"""Encoding and decoding the plugin <-> agent wire format: ``encode`` a message,
``decode_frame`` one frame, ``FrameDecoder`` a byte stream.

What a frame holds (the header, each message's fields, the payload layouts by version)
is ``native_plugin.wire``; this module builds one precomputed pack/unpack plan per type
and version from those layouts, and checks every value against the width it is sent in.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Final

from native_plugin.wire import (
    HEADER_SIZE,
    MAGIC,
    MAX_PAYLOAD,
    MIN_VERSION,
    PAYLOAD_LAYOUT,
    PAYLOAD_LAYOUT_V2,
    TO_PLUGIN,
    VERSION,
    Ack,
    AckAt,
    Command,
    CommandTransit,
    CommandWeights,
    Communicator,
    CqeError,
    Hello,
    Message,
    MsgType,
    PathSwitch,
    PortEvent,
    Progress,
    Stall,
    WireError,
)

__all__ = [
    "LARGEST_COMMAND_PAYLOAD",
    "LARGEST_REPORT_PAYLOAD",
    "FrameDecoder",
    "decode_frame",
    "encode",
]

_HEADER: Final = struct.Struct("<IHHII")
assert _HEADER.size == HEADER_SIZE

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
