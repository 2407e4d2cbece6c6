"""Round trips and malformed input for ``native_plugin.wire``."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from native_plugin import wire, wire_codec

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
NAME = st.text(
    st.characters(blacklist_characters="\0", blacklist_categories=["Cs"]), max_size=15
).filter(lambda s: len(s.encode()) < wire.NAME_LEN)

JOB = st.text(
    st.characters(blacklist_characters="\0", blacklist_categories=["Cs"]), max_size=80
).filter(lambda s: len(s.encode()) < wire.JOB_LEN)

MESSAGES: st.SearchStrategy[wire.Message] = st.one_of(
    st.builds(wire.CqeError, timestamp_ns=U64, port=U32, qp_num=U32, wc_status=U32,
              vendor_err=U32, pid=U32, dev_name=NAME, peer=NAME),
    st.builds(wire.PortEvent, timestamp_ns=U64, port=U32, ibv_event_type=U32, pid=U32,
              dev_name=NAME),
    st.builds(wire.PathSwitch, comm_id=U64, timestamp_ns=U64, channel=U32, reason=U32,
              pid=U32, from_dev=NAME, to_dev=NAME),
    st.builds(wire.Progress, comm_id=U64, ops_done=U64, timestamp_ns=U64, rank=U32, pid=U32),
    st.builds(wire.Hello, comm_id=U64, pid=U32, abi_version=U32, rank=U32),
    st.builds(wire.Hello, comm_id=U64, pid=U32, abi_version=U32, rank=U32, incarnation=U32,
              job=JOB),
    st.builds(wire.Communicator, comm_id=U64, timestamp_ns=U64, rank=U32, nranks=U32,
              n_nodes=U32, pid=U32, host=NAME, job=NAME),
    st.builds(wire.Stall, comm_id=U64, seq_number=U64, timestamp_ns=U64, open_ns=U64,
              rank=U32, pid=U32, func=NAME),
    st.builds(wire.Command, command_id=U64, comm_id=U64, ops_done=U64,
              disabled_channels=U64, kind=U32, epoch=U32),
    st.builds(wire.Ack, command_id=U64, status=I32, pid=U32),
    st.builds(wire.AckAt, command_id=U64, status=I32, pid=U32, ops_done=U64),
    # Weights that binary32 holds exactly, so a decoded frame equals the message.
    st.builds(wire.CommandWeights.of, U64,
              st.lists(st.integers(0, 2**20).map(lambda n: n / 2**20), max_size=64),
              st.integers(0, 2**20 - 1).map(lambda n: n / 2**20)),
    st.builds(wire.CommandTransit.of, U64, st.dictionaries(U32, U32, max_size=16), U32),
)  # fmt: skip

MAX_FRAME = wire.HEADER_SIZE + wire.MAX_PAYLOAD


@given(st.lists(MESSAGES, max_size=8), st.integers(1, 64))
def test_round_trip_any_chunking(msgs: list[wire.Message], chunk: int) -> None:
    stream = b"".join(wire_codec.encode(m) for m in msgs)
    decoder = wire_codec.FrameDecoder()
    out: list[wire.Message] = []
    for i in range(0, len(stream), chunk):
        out += decoder.feed(stream[i : i + chunk])
    assert out == msgs
    assert decoder.buffered == 0
    for m in msgs:
        assert wire_codec.decode_frame(wire_codec.encode(m)) == m


def test_known_bytes() -> None:
    frame = wire_codec.encode(wire.Ack(command_id=7, status=-3, pid=42))
    assert frame == (
        bytes.fromhex("524c5652010011001000000000000000") + struct.pack("<QiI", 7, -3, 42)
    )
    # Type 18: the same answer with the rank's ops_done after it, 24 bytes of payload.
    frame = wire_codec.encode(wire.AckAt(command_id=7, status=-3, pid=42, ops_done=1017))
    assert frame == (
        bytes.fromhex("524c5652010012001800000000000000") + struct.pack("<QiIQ", 7, -3, 42, 1017)
    )


def test_a_hello_naming_a_job_is_version_2_and_one_naming_none_is_version_1() -> None:
    named = wire.Hello(comm_id=9, pid=42, abi_version=3, rank=5, incarnation=2, job="llm-7")
    frame = wire_codec.encode(named)
    head = struct.pack("<IHHII", wire.MAGIC, 2, int(wire.MsgType.HELLO), 24 + wire.JOB_LEN, 0)
    body = struct.pack("<QIIII", 9, 42, 3, 5, 2) + b"llm-7".ljust(wire.JOB_LEN, b"\0")
    assert frame == head + body
    # No job: byte for byte what a plugin before version 2 sends (incarnation was reserved).
    bare = wire.Hello(comm_id=9, pid=42, abi_version=1, rank=5)
    old = struct.pack("<IHHII", wire.MAGIC, 1, int(wire.MsgType.HELLO), 24, 0)
    assert wire_codec.encode(bare) == old + struct.pack("<QIIII", 9, 42, 1, 5, 0)
    assert wire_codec.FrameDecoder().feed(frame + wire_codec.encode(bare)) == [named, bare]
    # A version-2 HELLO is 280 bytes, a version-1 one 24: either length at the other
    # version is refused.
    with pytest.raises(wire.WireError, match=r"does not match HELLO \(280 bytes at version 2"):
        wire_codec.decode_frame(struct.pack("<IHHII", wire.MAGIC, 2, 5, 24, 0) + bytes(24))
    with pytest.raises(wire.WireError, match=r"does not match HELLO \(24 bytes at version 1"):
        wire_codec.decode_frame(head[:4] + b"\x01\x00" + head[6:] + body)
    with pytest.raises(wire.WireError, match="at most 255 fit"):
        wire_codec.encode(wire.Hello(comm_id=0, pid=0, abi_version=3, rank=0, job="j" * 256))
    longest = replace_job(named, "j" * 255)
    assert wire_codec.decode_frame(wire_codec.encode(longest)) == longest


def replace_job(hello: wire.Hello, job: str) -> wire.Hello:
    return dataclasses.replace(hello, job=job)


def test_every_other_frame_is_version_1_and_is_read_at_version_2_too() -> None:
    """What a version-2 sender writes for an unchanged type, a version-1 receiver reads."""
    cmd = wire.Command(command_id=1, comm_id=2, ops_done=3, disabled_channels=4, kind=1, epoch=5)
    frame = wire_codec.encode(cmd)
    assert struct.unpack_from("<H", frame, 4) == (1,)
    assert wire_codec.decode_frame(frame[:4] + b"\x02\x00" + frame[6:]) == cmd


def test_extension_frames_refuse_what_does_not_fit() -> None:
    with pytest.raises(wire.WireError, match="at most 64"):
        wire.CommandWeights.of(1, [0.5] * 65, 0.0)
    with pytest.raises(wire.WireError, match="at most 16"):
        wire.CommandTransit.of(1, dict.fromkeys(range(17), 0), 40)
    with pytest.raises(wire.WireError, match="finite binary32"):
        wire_codec.encode(wire.CommandWeights.of(1, [float("nan")], 0.0))
    with pytest.raises(wire.WireError, match="finite binary32"):
        wire_codec.encode(wire.CommandWeights.of(1, [1.0], float("inf")))
    with pytest.raises(wire.WireError, match="not an integer"):
        wire_codec.encode(wire.CommandTransit.of(1, {0: -1}, 40))


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda f: b"XXXX" + f[4:], "magic"),
        (lambda f: f[:4] + b"\x03\x00" + f[6:], "version"),
        (lambda f: f[:6] + b"\x63\x00" + f[8:], "unknown message type 99"),
        (lambda f: f[:8] + struct.pack("<I", 2000) + f[12:], "exceeds"),
        (lambda f: f[:8] + struct.pack("<I", 12) + f[12:], "does not match ACK"),
    ],
)
def test_malformed_header_is_named(mutate: object, needle: str) -> None:
    frame = wire_codec.encode(wire.Ack(command_id=1, status=0, pid=1))
    assert callable(mutate)
    decoder = wire_codec.FrameDecoder()
    with pytest.raises(wire.WireError, match=needle):
        decoder.feed(mutate(frame))
    with pytest.raises(wire.WireError, match="already failed"):
        decoder.feed(frame)


def test_messages_before_a_bad_frame_are_kept_on_the_error() -> None:
    good = wire.Progress(comm_id=1, ops_done=2, timestamp_ns=3, rank=4, pid=5)
    with pytest.raises(wire.WireError) as info:
        wire_codec.FrameDecoder().feed(wire_codec.encode(good) + b"\0" * 16)
    assert info.value.decoded == [good]


@pytest.mark.parametrize(
    "msg",
    [
        wire.Ack(command_id=-1, status=0, pid=0),
        wire.Ack(command_id=0, status=2**31, pid=0),
        wire.PortEvent(timestamp_ns=0, port=0, ibv_event_type=0, pid=0, dev_name="x" * 64),
        wire.PortEvent(timestamp_ns=0, port=0, ibv_event_type=0, pid=0, dev_name="a\0b"),
    ],
)
def test_encode_rejects_values_that_do_not_fit(msg: wire.Message) -> None:
    with pytest.raises(wire.WireError):
        wire_codec.encode(msg)


def test_header_validated_before_payload_arrives() -> None:
    # A huge declared length is refused on the header alone, never awaited.
    header = struct.pack("<IHHII", wire.MAGIC, 1, 1, 2**32 - 1, 0)
    with pytest.raises(wire.WireError, match="exceeds"):
        wire_codec.FrameDecoder().feed(header)


def _feed_all(chunks: list[bytes]) -> None:
    decoder = wire_codec.FrameDecoder()
    for chunk in chunks:
        try:
            msgs = decoder.feed(chunk)
        except wire.WireError:
            return
        assert all(isinstance(m, wire.Message) for m in msgs)
        assert decoder.buffered < MAX_FRAME


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.lists(st.binary(max_size=3 * MAX_FRAME), max_size=6))
def test_fuzz_arbitrary_bytes(chunks: list[bytes]) -> None:
    _feed_all(chunks)


@FUZZ
@given(
    st.lists(MESSAGES, min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
    st.lists(st.integers(1, 2 * MAX_FRAME), min_size=1, max_size=4),
)
def test_fuzz_mutated_valid_frames(
    msgs: list[wire.Message], flips: list[tuple[int, int]], cuts: list[int]
) -> None:
    stream = bytearray(b"".join(wire_codec.encode(m) for m in msgs))
    for pos, value in flips:
        stream[pos % len(stream)] = value
    chunks: list[bytes] = []
    start = 0
    for cut in cuts:
        chunks.append(bytes(stream[start : start + cut]))
        start += cut
    chunks.append(bytes(stream[start:]))
    _feed_all(chunks)
