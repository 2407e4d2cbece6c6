"""The values the store's columns take, and the column types that hold them.

Job modes and fault kinds (the engine's), command kinds, command states and ack statuses
are the vocabulary of the jobs, faults, commands and command_acks tables (stored as their
string values); UInt64 and UtcDateTime are column types that keep a CCL communicator id
and an aware UTC time the same on both backends.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime

from sqlalchemy import BigInteger, DateTime, Dialect, Integer, TypeDecorator

from scheduler_svc.engine.fabric import WHOLE_DEVICE, FaultKind
from scheduler_svc.engine.state import Mode as JobMode

__all__ = [
    "BIG_ID",
    "SETTLED",
    "SWITCH_KINDS",
    "UNREACHABLE_DEVICE",
    "WAITING",
    "WHOLE_DEVICE_PORT",
    "AckStatus",
    "CommandKind",
    "CommandState",
    "FaultKind",
    "JobMode",
    "UInt64",
    "UtcDateTime",
]

# Fault.port of a fault that takes the whole RNIC (device fatal) rather than one port.
WHOLE_DEVICE_PORT = WHOLE_DEVICE
# Fault.device of an UNREACHABLE fault: every RNIC of the node (its port is WHOLE_DEVICE).
UNREACHABLE_DEVICE = "*"


class CommandKind(enum.StrEnum):
    FAILOVER = "failover"
    REBALANCE = "rebalance"
    FAILBACK = "failback"
    ABORT = "abort"
    # FlowCheck: take a normal checkpoint at the next iteration (not a path change).
    CHECKPOINT_NOW = "checkpoint_now"
    BALANCE = "balance"  # R²CCL balance: channel weights and allreduce split
    NVL_TRANSIT = "nvl_transit"  # ranks send through a peer GPU over NVLink


# Kinds whose commands carry a switch point all ranks of a communicator apply together.
SWITCH_KINDS = (CommandKind.REBALANCE, CommandKind.FAILBACK, CommandKind.BALANCE)


class CommandState(enum.StrEnum):
    ISSUED = "issued"
    DELIVERED = "delivered"
    APPLIED = "applied"
    SUPERSEDED = "superseded"
    FAILED = "failed"


# Still waiting for the ranks: what a poll returns and a deadline watches.
WAITING = (CommandState.ISSUED, CommandState.DELIVERED)
# Settled: nothing moves a command out of these.
SETTLED = (CommandState.APPLIED, CommandState.SUPERSEDED, CommandState.FAILED)


class AckStatus(enum.StrEnum):
    DELIVERED = "delivered"
    APPLIED = "applied"
    FAILED = "failed"
    # The rank was already past the switch point (at `ops_done`): nothing applied.
    TOO_LATE = "too_late"


class UInt64(TypeDecorator[int]):
    """An unsigned 64-bit number (a CCL communicator id) in a signed 64-bit column.

    Stored as its two's-complement bit pattern, so every value the wire allows
    fits both SQLite's INTEGER and PostgreSQL's BIGINT, and equality still works.
    """

    impl = BigInteger
    cache_ok = True

    def process_bind_param(self, value: int | None, dialect: Dialect) -> int | None:
        if value is None:
            return None
        return value - 2**64 if value >= 2**63 else value

    def process_result_value(self, value: int | None, dialect: Dialect) -> int | None:
        if value is None:
            return None
        return value + 2**64 if value < 0 else value


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite keeps no zone of its own)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass an aware UTC time")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# Ids of the big append-only tables: 64-bit on PostgreSQL, SQLite's INTEGER rowid there.
BIG_ID = BigInteger().with_variant(Integer, "sqlite")
