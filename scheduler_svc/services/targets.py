"""Whether an event batch names only what its nodes registered, at a believable time.

Checked before anything of the batch is stored: an event for a device or port
the node never registered (a typo, `../etc`, a card hot-plugged but not yet
registered) would open a fault on nothing and make a decision for a false
reason. Pure functions over the registered ports, plus the reads of those ports
and of rank placement; the events route calls `refuse_unknown` before ingesting.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select, tuple_
from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.api.schemas.events import EventIn, EventKind
from scheduler_svc.errors import Forbidden, Unprocessable
from scheduler_svc.store import models as m
from scheduler_svc.store import plain

# ibv_event_type values that say something about a port or the whole device.
_LOCATED_EVENT_TYPES = {8, 9, 10}


class Reason(enum.StrEnum):
    UNKNOWN_DEVICE = "unknown_device"
    UNKNOWN_PORT = "unknown_port"
    NO_DEVICE = "no_device"
    RANK_ELSEWHERE = "rank_elsewhere"
    FUTURE_TIME = "future_time"


@dataclass(frozen=True, slots=True)
class Refusal:
    index: int
    field: str
    reason: Reason
    problem: str

    def message(self) -> str:
        return f"events.{self.index}.{self.field}: {self.problem}"


@dataclass(frozen=True, slots=True)
class Topology:
    """A node's registered RNIC ports: device name -> port numbers."""

    ports: Mapping[str, frozenset[int]]


# Built once: building it took longer than running it (see store/commands.py).
_REGISTERED_PORTS = (
    select(m.Node.name, m.Rnic.name, m.Rnic.port)
    .outerjoin(m.Rnic, m.Rnic.node == m.Node.name)
    .where(m.Node.name.in_(bindparam("names", expanding=True)))
)


def registered_ports(session: Session, names: Iterable[str]) -> dict[str, Topology]:
    """The RNIC ports of each of these nodes that is registered (a node without RNICs maps
    to an empty topology), in one query of plain rows: a report needs no more of its node."""
    rows = plain.execute(session, _REGISTERED_PORTS, {"names": list(names)}).tuples()
    ports: dict[str, dict[str, set[int]]] = {}
    for node, device, port in rows:
        devices = ports.setdefault(node, {})
        if device is not None:
            devices.setdefault(device, set()).add(port)
    return {
        node: Topology({d: frozenset(p) for d, p in devices.items()})
        for node, devices in ports.items()
    }


def check_devices(
    events: Sequence[EventIn],
    topologies: Mapping[str, Topology],
    now: datetime,
    future_skew: timedelta,
) -> list[Refusal]:
    """Events naming unregistered devices or ports, or observed too far in the future."""
    out: list[Refusal] = []
    latest = now + future_skew
    for i, e in enumerate(events):
        if e.observed_at > latest:
            out.append(
                Refusal(
                    i,
                    "observed_at",
                    Reason.FUTURE_TIME,
                    f"{e.observed_at.isoformat()} is more than {future_skew.total_seconds():g} s "
                    "ahead of the service's clock; check the node's clock",
                )
            )
        topo = topologies.get(e.node)
        if topo is None:
            continue  # the route answers unregistered nodes itself
        if e.device is None:
            if e.kind == EventKind.PORT_EVENT and e.event_type in _LOCATED_EVENT_TYPES:
                out.append(
                    Refusal(i, "device", Reason.NO_DEVICE, "required for this port event type")
                )
            continue
        ports = topo.ports.get(e.device)
        if ports is None:
            known = ", ".join(sorted(topo.ports)[:8]) or "none"
            out.append(
                Refusal(
                    i,
                    "device",
                    Reason.UNKNOWN_DEVICE,
                    f"node {e.node!r} has not registered device {e.device!r} (registered: "
                    f"{known}); register a new RNIC with PUT /v1/nodes/{e.node} first",
                )
            )
        elif e.port is not None and e.port not in ports:
            out.append(
                Refusal(
                    i,
                    "port",
                    Reason.UNKNOWN_PORT,
                    f"device {e.device!r} of node {e.node!r} has no registered port {e.port} "
                    f"(registered: {', '.join(str(p) for p in sorted(ports))})",
                )
            )
    return out


def check_ranks(session: Session, events: Sequence[EventIn]) -> list[Refusal]:
    """Progress for a rank that its communicator's job placed on another node."""
    progress = [
        (i, e)
        for i, e in enumerate(events)
        if e.kind == EventKind.PROGRESS and e.rank is not None and e.comm_id is not None
    ]
    if not progress:
        return []
    jobs = dict(
        session.execute(
            select(m.Communicator.comm_id, m.Communicator.job_id).where(
                m.Communicator.comm_id.in_({e.comm_id for _, e in progress})
            )
        )
        .tuples()
        .all()
    )
    wanted = {(jobs[e.comm_id], e.rank or 0) for _, e in progress if e.comm_id in jobs}
    placed = _placement(session, wanted)
    out = []
    for i, e in progress:
        job_id = jobs.get(e.comm_id) if e.comm_id is not None else None
        if job_id is None:
            continue  # an unregistered communicator: ingestion ignores it
        node = placed.get((job_id, e.rank or 0))
        if node != e.node:
            where = "not a rank of it" if node is None else f"placed on node {node!r}"
            out.append(
                Refusal(
                    i,
                    "rank",
                    Reason.RANK_ELSEWHERE,
                    f"rank {e.rank} of job {job_id!r} is {where}, not on {e.node!r}",
                )
            )
    return out


def _placement(session: Session, wanted: Iterable[tuple[str, int]]) -> dict[tuple[str, int], str]:
    keys = list(wanted)
    if not keys:
        return {}
    rows = session.execute(
        select(m.JobRank.job_id, m.JobRank.rank, m.JobRank.node).where(
            tuple_(m.JobRank.job_id, m.JobRank.rank).in_(keys)
        )
    ).tuples()
    return {(job, rank): node for job, rank, node in rows}


def refuse_unknown(
    session: Session,
    events: Sequence[EventIn],
    topologies: Mapping[str, Topology],
    *,
    now: datetime,
    future_skew_s: float,
    agent: bool,
) -> None:
    """Raise (nothing stored yet) when any event names what its node has not registered.

    Progress for a rank on another node is an agent overreaching its node (403),
    or a fleet manager's mistake (422); the rest are 422, each refusal counted.
    """
    refusals = check_devices(events, topologies, now, timedelta(seconds=future_skew_s))
    refusals += check_ranks(session, events)
    if not refusals:
        return
    for r in refusals:
        metrics.EVENTS_REFUSED.labels(reason=r.reason.value).inc()
    refusals.sort(key=lambda r: r.index)
    messages = [r.message() for r in refusals[:20]]
    if agent and all(r.reason == Reason.RANK_ELSEWHERE for r in refusals):
        raise Forbidden(messages)
    raise Unprocessable(messages)
