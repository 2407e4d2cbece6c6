"""The plugin library's C ABI as ctypes declares it (``include/railover_plugin.h``).

The status codes, the structs field by field (``railover_config_t`` is
``RailoverConfig`` and so on; ``tests/native_plugin/test_plugin_abi_agreement.py``
holds them to the header), the function tables ``railoverPlugin_v1`` to ``_v3``, and
loading the library, once per path. ``native_plugin.binding`` is the Python view
built on it: ``Plugin``, the command and agreement types, ``agree``.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Final

from native_plugin.wire import MAX_CHANNELS, MAX_TRANSIT

ABI_VERSION: Final = 3
DEFAULT_LIBRARY: Final = Path(__file__).resolve().parent / "build" / "librailover_plugin.so"

# railover_status_t
OK: Final = 0
DROPPED: Final = 1
NO_COMMAND: Final = 2


class Status:
    """``railover_status_t`` values."""

    OK: Final = OK
    DROPPED: Final = DROPPED
    NO_COMMAND: Final = NO_COMMAND
    ERR_INVALID: Final = -1
    ERR_SYSTEM: Final = -2
    ERR_CONFIG: Final = -3


_STATUS_TEXT: Final = {
    -1: "invalid argument",
    -2: "system error (memory, thread or pipe)",
    -3: "bad configuration (see the plugin log)",
}


class PluginError(RuntimeError):
    """A plugin call returned a negative status."""

    def __init__(self, call: str, status: int) -> None:
        super().__init__(f"{call} failed: {_STATUS_TEXT.get(status, 'unknown error')} ({status})")
        self.status = status


class PluginLibraryNotFoundError(FileNotFoundError):
    """``librailover_plugin.so`` is not where it was looked for."""


# --- C structs ------------------------------------------------------------------------------


class RailoverConfig(ctypes.Structure):
    _fields_ = (
        ("socket_path", ctypes.c_char_p),
        ("ring_size", ctypes.c_uint32),
        ("rank", ctypes.c_uint32),
        ("comm_id", ctypes.c_uint64),
        ("reconnect_min_ms", ctypes.c_uint32),
        ("reconnect_max_ms", ctypes.c_uint32),
        ("log_interval_ms", ctypes.c_uint32),
        ("drain_timeout_ms", ctypes.c_uint32),
    )


class RailoverConfigV3(ctypes.Structure):
    _fields_ = (
        ("base", RailoverConfig),
        ("job_id", ctypes.c_char_p),
        ("incarnation", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    )


class RailoverCommand(ctypes.Structure):
    _fields_ = (
        ("command_id", ctypes.c_uint64),
        ("comm_id", ctypes.c_uint64),
        ("ops_done", ctypes.c_uint64),
        ("disabled_channels", ctypes.c_uint64),
        ("kind", ctypes.c_uint32),
        ("epoch", ctypes.c_uint32),
    )


class RailoverCommandV2(ctypes.Structure):
    _fields_ = (
        ("base", RailoverCommand),
        ("n_channels", ctypes.c_uint32),
        ("split_ratio", ctypes.c_float),
        ("weights", ctypes.c_float * MAX_CHANNELS),
        ("n_transit", ctypes.c_uint32),
        ("mb_per_channel", ctypes.c_uint32),
        ("transit_ranks", ctypes.c_uint32 * MAX_TRANSIT),
        ("transit_gpus", ctypes.c_uint32 * MAX_TRANSIT),
        ("iteration", ctypes.c_uint64),
    )


@dataclass(frozen=True, slots=True)
class Stats:
    """``railover_stats_t``: counters since init (see the header for each field)."""

    sent: int
    dropped_ring_full: int
    dropped_no_agent: int
    queued: int
    bytes_sent: int
    hellos_sent: int
    acks_sent: int
    acks_dropped: int
    commands_received: int
    commands_dropped: int
    commands_unsupported: int
    malformed_received: int
    connects: int
    disconnects: int
    connect_failures: int
    connected: int
    commands_invalid: int

    @property
    def dropped(self) -> int:
        """All reports dropped, for whatever reason."""
        return self.dropped_ring_full + self.dropped_no_agent


class RailoverStats(ctypes.Structure):
    _fields_ = tuple((f.name, ctypes.c_uint64) for f in fields(Stats))


class RailoverSwitchVote(ctypes.Structure):
    _fields_ = (
        ("ops_done", ctypes.c_uint64),
        ("switch_at", ctypes.c_uint64),
        ("disabled_channels", ctypes.c_uint64),
        ("epoch", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
    )


class RailoverAgreement(ctypes.Structure):
    _fields_ = (
        ("outcome", ctypes.c_uint32),
        ("action", ctypes.c_uint32),
        ("epoch", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("switch_at", ctypes.c_uint64),
        ("max_ops_done", ctypes.c_uint64),
    )


LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p)
_HANDLE = ctypes.c_void_p
_u32, _u64, _i32, _str = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32, ctypes.c_char_p
_INIT = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(RailoverConfig), LOG_FN, ctypes.POINTER(ctypes.c_void_p)
)
_FINALIZE = ctypes.CFUNCTYPE(ctypes.c_int, _HANDLE)
_CQE = ctypes.CFUNCTYPE(ctypes.c_int, _HANDLE, _str, _u32, _u32, _u32, _u32, _str)
_PORT = ctypes.CFUNCTYPE(ctypes.c_int, _HANDLE, _str, _u32, _u32)
_SWITCH = ctypes.CFUNCTYPE(ctypes.c_int, _HANDLE, _u64, _u32, _str, _str, _u32)
_PROGRESS = ctypes.CFUNCTYPE(ctypes.c_int, _HANDLE, _u64, _u32, _u64)
_POLL = ctypes.CFUNCTYPE(ctypes.c_int, _HANDLE, ctypes.POINTER(RailoverCommand))
_ACK = ctypes.CFUNCTYPE(ctypes.c_int, _HANDLE, _u64, _i32)
_STATS = ctypes.CFUNCTYPE(ctypes.c_int, _HANDLE, ctypes.POINTER(RailoverStats), ctypes.c_size_t)
_ACK_AT = ctypes.CFUNCTYPE(ctypes.c_int, _HANDLE, _u64, _i32, _u64)
_POLL2 = ctypes.CFUNCTYPE(ctypes.c_int, _HANDLE, ctypes.POINTER(RailoverCommandV2), ctypes.c_size_t)
_AGREE = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(RailoverSwitchVote), _u32, _u32, ctypes.POINTER(RailoverAgreement)
)
_INIT3 = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.POINTER(RailoverConfigV3),
    ctypes.c_size_t,
    LOG_FN,
    ctypes.POINTER(ctypes.c_void_p),
)


class PluginTableV1(ctypes.Structure):
    """``railoverPlugin_v1_t``."""

    _fields_ = (
        ("name", ctypes.c_char_p),
        ("abi_version", ctypes.c_uint32),
        ("init", _INIT),
        ("finalize", _FINALIZE),
        ("report_cqe_error", _CQE),
        ("report_port_event", _PORT),
        ("report_path_switch", _SWITCH),
        ("report_progress", _PROGRESS),
        ("poll_command", _POLL),
        ("ack_command", _ACK),
        ("stats", _STATS),
        ("ack_command_at", _ACK_AT),
        ("agree", _AGREE),
    )


class PluginTableV2(ctypes.Structure):
    """``railoverPlugin_v2_t``: v1's members, then ABI 2's."""

    _fields_ = (*PluginTableV1._fields_, ("poll_command_v2", _POLL2))


class PluginTableV3(ctypes.Structure):
    """``railoverPlugin_v3_t``: v2's members, then ABI 3's."""

    _fields_ = (*PluginTableV2._fields_, ("init_v3", _INIT3))


# --- loading --------------------------------------------------------------------------------

_loaded: dict[Path, PluginTableV3] = {}
_load_lock = threading.Lock()


def library_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The library to load: ``path``, else ``$RAILOVER_PLUGIN_LIB``, else the build output."""
    if path is not None:
        return Path(path)
    env = os.environ.get("RAILOVER_PLUGIN_LIB")
    return Path(env) if env else DEFAULT_LIBRARY


def load_library(path: str | os.PathLike[str] | None = None) -> PluginTableV3:
    """Load the library once per path and return its ``railoverPlugin_v3`` table."""
    lib_path = library_path(path).resolve()
    with _load_lock:
        table = _loaded.get(lib_path)
        if table is not None:
            return table
        if not lib_path.is_file():
            raise PluginLibraryNotFoundError(
                f"native plugin library not found at {lib_path}; "
                "build it with `make -C native_plugin` (or set RAILOVER_PLUGIN_LIB)"
            )
        lib = ctypes.CDLL(str(lib_path))
        v1 = PluginTableV1.in_dll(lib, "railoverPlugin_v1")
        if v1.abi_version != 1:
            raise PluginError(f"loading {lib_path}: railoverPlugin_v1 says {v1.abi_version}", -3)
        v2 = PluginTableV2.in_dll(lib, "railoverPlugin_v2")
        if v2.abi_version != 2:
            raise PluginError(f"loading {lib_path}: railoverPlugin_v2 says {v2.abi_version}", -3)
        table = PluginTableV3.in_dll(lib, "railoverPlugin_v3")
        if table.abi_version != ABI_VERSION:
            raise PluginError(f"loading {lib_path}: ABI version {table.abi_version}", -3)
        _loaded[lib_path] = table
        return table
