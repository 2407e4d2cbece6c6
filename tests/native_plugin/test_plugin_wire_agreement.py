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

from native_plugin import wire
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
}

C_CONSTANTS = {
    "RAILOVER_WIRE_MAGIC": wire.MAGIC,
    "RAILOVER_WIRE_VERSION": wire.VERSION,
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
    "RAILOVER_WIRE_LARGEST_V1_PAYLOAD": max(
        struct.calcsize("<" + "".join(c for _, c in layout))
        for layout in wire.PAYLOAD_LAYOUT.values()
    ),
}

HEADER_FIELDS = (("magic", "I"), ("version", "H"), ("type", "H"), ("payload_len", "I"),
                 ("reserved", "I"))  # fmt: skip


def python_layout() -> dict[str, int]:
    """Every number the C program prints, computed from the Python description."""
    out = dict(C_CONSTANTS)
    layouts: dict[str, tuple[tuple[str, str], ...]] = {"railover_wire_header": HEADER_FIELDS}
    layouts.update({C_STRUCTS[t]: fields for t, fields in wire.PAYLOAD_LAYOUT.items()})
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
