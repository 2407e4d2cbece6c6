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
        "device_lost",
        "port_rate",
    }
)
# Samples the service can do without: the next one supersedes them. These are
# what a full spool drops first; everything else is a fault or a state change.
DROPPABLE_KINDS = frozenset({"progress"})

# The order in which waiting events go to the service: port and device state first, then
# the other faults and evidence, samples last. Within a lane, the order they happened in. A
# flood of one lane (CQE noise, progress) never holds back a lower-numbered one.
LANE_STATE, LANE_FAULT, LANE_SAMPLE = 0, 1, 2
LANES: dict[str, int] = {
    "port_down": LANE_STATE,
    "port_up": LANE_STATE,
    "port_event": LANE_STATE,
    "device_fatal": LANE_STATE,
    "device_lost": LANE_STATE,
    "pcie_degraded": LANE_STATE,
    "port_rate": LANE_STATE,
    "path_switch": LANE_STATE,
    "cqe_error": LANE_FAULT,
    "counter": LANE_FAULT,
    "stall": LANE_FAULT,
    "communicator": LANE_FAULT,
    "progress": LANE_SAMPLE,
}

# Kinds a full spool folds into one row per component: what they say is "this component
# keeps erroring", and the count and the newest instance say it as well as every row.
# The fields that name the component, per kind.
COALESCE_BY: dict[str, tuple[str, ...]] = {
    "cqe_error": ("device", "port", "wc_status", "comm_id", "rank"),
    "counter": ("device", "port", "counter"),
    "stall": ("comm_id", "rank"),
}


def lane_of(kind: str) -> int:
    return LANES.get(kind, LANE_FAULT)


def coalesce_key(ev: Event) -> str | None:
    """The component an event of a coalescible kind is about; None for other kinds."""
    fields = COALESCE_BY.get(ev["kind"])
    if fields is None:
        return None
    return "|".join([ev["kind"], *(str(ev.get(f, "")) for f in fields)])


def coalesce(older: Event, newer: Event) -> Event:
    """One event saying what both said: the newer one's facts, the older one's id and start,
    the number of events it stands for in ``detail.coalesced`` (a counter's deltas summed)."""
    merged = dict(newer)
    merged["event_id"] = older["event_id"]
    new_detail, old_detail = newer.get("detail"), older.get("detail")
    detail = dict(new_detail) if isinstance(new_detail, dict) else {}
    old = old_detail if isinstance(old_detail, dict) else {}
    detail["coalesced"] = int(old.get("coalesced", 1)) + int(detail.get("coalesced", 1))
    detail["first_observed_at"] = old.get("first_observed_at", older.get("observed_at"))
    merged["detail"] = detail
    if newer["kind"] == "counter":
        merged["delta"] = int(older.get("delta") or 0) + int(newer.get("delta") or 0)
    return merged


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
