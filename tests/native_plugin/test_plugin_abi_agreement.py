"""The ctypes structs in ``native_plugin.abi`` match ``railover_plugin.h`` field by field."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

from native_plugin import abi, binding
from tests.deploy.tools import need_tool

INCLUDE = Path(__file__).resolve().parents[2] / "native_plugin" / "include"

STRUCTS: dict[str, type[ctypes.Structure]] = {
    "railover_config_t": abi.RailoverConfig,
    "railover_command_t": abi.RailoverCommand,
    "railover_stats_t": abi.RailoverStats,
    "railover_switch_vote_t": abi.RailoverSwitchVote,
    "railover_agreement_t": abi.RailoverAgreement,
    "railoverPlugin_v1_t": abi.PluginTableV1,
    "railover_command_v2_t": abi.RailoverCommandV2,
    "railoverPlugin_v2_t": abi.PluginTableV2,
    "railover_config_v3_t": abi.RailoverConfigV3,
    "railoverPlugin_v3_t": abi.PluginTableV3,
}


def ctypes_layout() -> dict[str, int]:
    out = {"RAILOVER_PLUGIN_ABI_VERSION": abi.ABI_VERSION}
    for cname, cls in STRUCTS.items():
        out[f"sizeof({cname})"] = ctypes.sizeof(cls)
        for field in cls._fields_:
            name = field[0]
            out[f"offsetof({cname},{name})"] = getattr(cls, name).offset
    for name in ("OK", "DROPPED", "NO_COMMAND", "ERR_INVALID", "ERR_SYSTEM", "ERR_CONFIG"):
        out[f"RAILOVER_{name}"] = getattr(abi.Status, name)
    out.update({f"RAILOVER_AGREE_{o.name}": o.value for o in binding.AgreeOutcome})
    out.update({f"RAILOVER_ACT_{a.name}": a.value for a in binding.AgreeAction})
    return out


# The header is C11 and C++17 (a CCL built on NCCL is C++): both must see the same layout.
COMPILERS = [
    pytest.param(["cc", "-std=c11", "-x", "c"], id="c11"),
    pytest.param(["c++", "-std=c++17", "-x", "c++"], id="cxx17"),
]


@pytest.mark.parametrize("compiler", COMPILERS)
def test_ctypes_structs_match_header(compiler: list[str], tmp_path: Path) -> None:
    need_tool(compiler[0])  # a failure, not a skip, under `make test`
    expected = ctypes_layout()
    body = "".join(
        f'  printf("%s=%lld\\n", "{key}", (long long)({key}));\n' for key in sorted(expected)
    )
    src = tmp_path / "abi.c"
    head = '#include <stdio.h>\n#include "railover_plugin.h"\nint main(void) {\n'
    src.write_text(f"{head}{body}  return 0;\n}}\n")
    exe = tmp_path / "abi"
    subprocess.run(
        [*compiler, "-Wall", "-Werror", f"-I{INCLUDE}", str(src), "-o", str(exe)],
        check=True,
    )
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = {k: int(v) for k, v in (line.split("=", 1) for line in printed.splitlines())}
    assert got == expected
