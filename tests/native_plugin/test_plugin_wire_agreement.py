"""The C header and ``native_plugin.wire`` describe the same bytes.

A C program is generated from the Python layout, compiled against the header (so a
field missing in C fails to compile) and prints every size, offset and constant; the
Python side must compute the same numbers.
"""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from native_plugin import wire, wire_codec
from tests.deploy.tools import need_tool

INCLUDE = Path(__file__).resolve().parents[2] / "native_plugin" / "include"

C_STRUCTS = {
    wire.MsgType.CQE_ERROR: "railover_wire_cqe_error",
    wire.MsgType.PORT_EVENT: "railover_wire_port_event",
    wire.MsgType.PATH_SWITCH: "railover_wire_path_switch",
    wire.MsgType.PROGRESS: "railover_wire_progress",
    wire.MsgType.HELLO: "railover_wire_hello",
    wire.MsgType.COMMUNICATOR: "railover_wire_communicator",
    wire.MsgType.STALL: "railover_wire_stall",
    wire.MsgType.COMMAND: "railover_wire_command",
    wire.MsgType.ACK: "railover_wire_ack",
    wire.MsgType.ACK_AT: "railover_wire_ack_at",
    wire.MsgType.COMMAND_WEIGHTS: "railover_wire_command_weights",
    wire.MsgType.COMMAND_TRANSIT: "railover_wire_command_transit",
}

# Version 2's payloads (the types it changed), as C names them.
C_STRUCTS_V2 = {wire.MsgType.HELLO: "railover_wire_hello_v2"}

C_CONSTANTS = {
    "RAILOVER_WIRE_MAGIC": wire.MAGIC,
    "RAILOVER_WIRE_VERSION": wire.VERSION,
    "RAILOVER_WIRE_VERSION_MIN": wire.MIN_VERSION,
    "RAILOVER_WIRE_JOB_LEN": wire.JOB_LEN,
    "RAILOVER_WIRE_HEADER_SIZE": wire.HEADER_SIZE,
    "RAILOVER_WIRE_MAX_PAYLOAD": wire.MAX_PAYLOAD,
    "RAILOVER_WIRE_NAME_LEN": wire.NAME_LEN,
    "RAILOVER_RANK_UNKNOWN": wire.RANK_UNKNOWN,
    "RAILOVER_WIRE_HELLO_NCCL_PROFILER": wire.HELLO_NCCL_PROFILER,
    "sizeof(railover_wire_header)": wire.HEADER_SIZE,
    **{f"RAILOVER_MSG_{t.name}": t.value for t in wire.MsgType},
    **{f"RAILOVER_CMD_{k.name}": k.value for k in wire.CommandKind},
    **{f"RAILOVER_SWITCH_{r.name}": r.value for r in wire.SwitchReason},
    **{f"RAILOVER_ACK_{s.name}": s.value for s in wire.AckStatus},
    "RAILOVER_WIRE_MAX_CHANNELS": wire.MAX_CHANNELS,
    "RAILOVER_WIRE_MAX_TRANSIT": wire.MAX_TRANSIT,
    # The ring carries plugin -> agent frames only; the agent's frames have their own bound.
    "RAILOVER_WIRE_LARGEST_V1_PAYLOAD": max(
        struct.calcsize("<" + "".join(c for _, c in layout))
        for t, layout in wire.PAYLOAD_LAYOUT.items()
        if t not in wire.TO_PLUGIN
    ),
    "RAILOVER_WIRE_LARGEST_V1_COMMAND_PAYLOAD": max(
        struct.calcsize("<" + "".join(c for _, c in layout))
        for t, layout in wire.PAYLOAD_LAYOUT.items()
        if t in wire.TO_PLUGIN
    ),
}

HEADER_FIELDS = (("magic", "I"), ("version", "H"), ("type", "H"), ("payload_len", "I"),
                 ("reserved", "I"))  # fmt: skip


def python_layout() -> dict[str, int]:
    """Every number the C program prints, computed from the Python description."""
    out = dict(C_CONSTANTS)
    layouts: dict[str, tuple[tuple[str, str], ...]] = {"railover_wire_header": HEADER_FIELDS}
    layouts.update({C_STRUCTS[t]: fields for t, fields in wire.PAYLOAD_LAYOUT.items()})
    layouts.update({C_STRUCTS_V2[t]: fields for t, fields in wire.PAYLOAD_LAYOUT_V2.items()})
    for cname, fields in layouts.items():
        offset = 0
        for name, code in fields:
            size = struct.calcsize("<" + code)
            out[f"offsetof({cname},{name})"] = offset
            out[f"sizeof(((({cname}*)0)->{name}))"] = size
            offset += size
        out[f"sizeof({cname})"] = offset
    return out


def c_program(keys: list[str]) -> str:
    lines = ["#include <stdio.h>", '#include "railover_wire.h"', "int main(void) {"]
    for key in keys:
        lines.append(f'  printf("%s=%lld\\n", "{key}", (long long)({key}));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


# The header is C11 and C++17 (a CCL built on NCCL is C++): both must see the same layout.
COMPILERS = [
    pytest.param(["cc", "-std=c11", "-x", "c"], id="c11"),
    pytest.param(["c++", "-std=c++17", "-x", "c++"], id="cxx17"),
]


@pytest.mark.parametrize("compiler", COMPILERS)
def test_header_matches_python(compiler: list[str], tmp_path: Path) -> None:
    need_tool(compiler[0])  # a failure, not a skip, under `make test`
    expected = python_layout()
    src = tmp_path / "layout.c"
    src.write_text(c_program(sorted(expected)))
    exe = tmp_path / "layout"
    subprocess.run(
        [*compiler, "-Wall", "-Werror", f"-I{INCLUDE}", str(src), "-o", str(exe)],
        check=True,
        capture_output=True,
        text=True,
    )
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = {k: int(v) for k, v in (line.split("=", 1) for line in printed.splitlines())}
    assert got == expected


def test_every_message_type_has_a_layout_and_class() -> None:
    assert set(wire.PAYLOAD_LAYOUT) == set(wire.MsgType) == set(C_STRUCTS)
    assert set(wire.PAYLOAD_LAYOUT_V2) == set(C_STRUCTS_V2)


def test_largest_payload_constants() -> None:
    assert (wire_codec.LARGEST_REPORT_PAYLOAD, wire_codec.LARGEST_COMMAND_PAYLOAD) == (160, 272)
    assert wire_codec.LARGEST_COMMAND_PAYLOAD <= wire.MAX_PAYLOAD


# The extension frames filled in C, field by field, and printed as bytes: the Python
# encoder must write exactly those bytes (header included).
C_BYTES = r"""
#include <stdio.h>
#include <string.h>
#include "railover_wire.h"
static void dump_at(unsigned version, unsigned type, const void* p, unsigned n) {
  railover_wire_header h = {RAILOVER_WIRE_MAGIC, (uint16_t)version, (uint16_t)type, n, 0};
  const unsigned char* b = (const unsigned char*)&h;
  for (unsigned i = 0; i < sizeof(h); i++) printf("%02x", b[i]);
  b = (const unsigned char*)p;
  for (unsigned i = 0; i < n; i++) printf("%02x", b[i]);
  printf("\n");
}
/* Frames whose layout version 2 did not change are written at version 1. */
static void dump(unsigned type, const void* p, unsigned n) {
  dump_at(RAILOVER_WIRE_VERSION_MIN, type, p, n);
}
int main(void) {
  railover_wire_command c;
  memset(&c, 0, sizeof(c));
  c.command_id = 41; c.comm_id = 0xABCDEF0123456789ull; c.ops_done = 1200;
  c.disabled_channels = 0x11; c.kind = RAILOVER_CMD_BALANCE; c.epoch = 9;
  dump(RAILOVER_MSG_COMMAND, &c, sizeof(c));
  railover_wire_command_weights w;
  memset(&w, 0, sizeof(w));
  w.command_id = 41; w.n_channels = 8; w.split_ratio = 0.125f;
  const float ws[8] = {0.0625f, 0.125f, 0.125f, 0.125f, 0.0625f, 0.125f, 0.125f, 0.25f};
  memcpy(w.weights, ws, sizeof(ws));
  dump(RAILOVER_MSG_COMMAND_WEIGHTS, &w, sizeof(w));
  railover_wire_command_transit t;
  memset(&t, 0, sizeof(t));
  t.command_id = 42; t.n_ranks = 2; t.mb_per_channel = 40;
  t.ranks[0] = 3; t.transit_gpus[0] = 2; t.ranks[1] = 11; t.transit_gpus[1] = 7;
  dump(RAILOVER_MSG_COMMAND_TRANSIT, &t, sizeof(t));
  railover_wire_hello_v2 hv;
  memset(&hv, 0, sizeof(hv));
  hv.comm_id = 0xC0FFEEull; hv.pid = 4242; hv.abi_version = 3; hv.rank = RAILOVER_RANK_UNKNOWN;
  hv.incarnation = 6; strcpy(hv.job, "job-\xc3\xa9t\xc3\xa9");
  dump_at(RAILOVER_WIRE_VERSION, RAILOVER_MSG_HELLO, &hv, sizeof(hv));
  return 0;
}
"""


@pytest.mark.parametrize("compiler", COMPILERS)
def test_extension_and_hello_frames_byte_for_byte(compiler: list[str], tmp_path: Path) -> None:
    need_tool(compiler[0])
    src = tmp_path / "bytes.c"
    src.write_text(C_BYTES)
    exe = tmp_path / "bytes"
    subprocess.run(
        [*compiler, "-Wall", "-Werror", f"-I{INCLUDE}", str(src), "-o", str(exe)],
        check=True,
        capture_output=True,
        text=True,
    )
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    command, weights, transit, hello = (bytes.fromhex(line) for line in printed.split())
    assert hello == wire_codec.encode(
        wire.Hello(comm_id=0xC0FFEE, pid=4242, abi_version=3, rank=wire.RANK_UNKNOWN,
                   incarnation=6, job="job-été")
    )  # fmt: skip
    assert len(hello) == 16 + 280
    ws = (0.0625, 0.125, 0.125, 0.125, 0.0625, 0.125, 0.125, 0.25)
    assert command == wire_codec.encode(
        wire.Command(command_id=41, comm_id=0xABCDEF0123456789, ops_done=1200,
                     disabled_channels=0x11, kind=wire.CommandKind.BALANCE, epoch=9)
    )  # fmt: skip
    assert weights == wire_codec.encode(wire.CommandWeights.of(41, ws, 0.125))
    assert len(weights) == 16 + 272
    assert transit == wire_codec.encode(wire.CommandTransit.of(42, {11: 7, 3: 2}, 40))
    assert len(transit) == 16 + 144
    decoded = wire_codec.decode_frame(weights)
    assert isinstance(decoded, wire.CommandWeights)
    assert (decoded.n_channels, decoded.split_ratio, decoded.used) == (8, 0.125, ws)
