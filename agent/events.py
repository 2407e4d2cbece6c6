"""Events as the service's ``POST /v1/events`` takes them.

An event gets its id the moment it is created, before it is spooled, so every
resend of it (after a timeout, a crash, a restart) carries the same id and the
service counts it once.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

KINDS = frozenset(
    {
        "port_down",
        "port_up",
        "cqe_error",
        "counter",
        "pcie_degraded",
        "port_event",
        "path_switch",
        "progress",
        "device_fatal",
        "communicator",
        "stall",
    }
)
# Samples the service can do without: the next one supersedes them. These are
# what a full spool drops first; everything else is a fault or a state change.
DROPPABLE_KINDS = frozenset({"progress"})

Event = dict[str, Any]


def rfc3339(ts: datetime | None = None) -> str:
    return (ts or datetime.now(UTC)).isoformat(timespec="microseconds").replace("+00:00", "Z")


def new_event(node: str, kind: str, observed_at: datetime | None = None, **fields: Any) -> Event:
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    ev: Event = {
        "event_id": uuid.uuid4().hex,
        "node": node,
        "kind": kind,
        "observed_at": rfc3339(observed_at),
    }
    ev.update({k: v for k, v in fields.items() if v is not None})
    return ev
