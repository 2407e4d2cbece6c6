"""What a degradation is measured against: the rate a port registered with, the newest
report of a level (a port's rate, a PCIe link) by observation time, and how far an error
counter rose over a window."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler_svc.store import models as m


class DegradationRepo:
    def __init__(self, session: Session) -> None:
        self.s = session

    def registered_rate(self, node: str, device: str, port: int) -> float | None:
        """The rate (Gb/s) the port registered with; None for a port not registered."""
        return self.s.scalar(
            select(m.Rnic.rate_gbps).where(
                m.Rnic.node == node, m.Rnic.name == device, m.Rnic.port == port
            )
        )

    def newer_report(
        self, node: str, kind: str, *, device: str, port: int | None, at: datetime, event_id: str
    ) -> bool:
        """Whether another report of `kind` on the component was observed after `at`: then
        the one observed at `at` is history, and the newer one is the level."""
        q = select(m.Event.event_id).where(
            m.Event.node == node,
            m.Event.kind == kind,
            m.Event.device == device,
            m.Event.observed_at > at,
            m.Event.event_id != event_id,
        )
        q = q.where(m.Event.port.is_(None) if port is None else m.Event.port == port)
        return self.s.scalar(q.limit(1)) is not None

    def counter_rise(
        self, node: str, device: str, *, port: int, counter: str, since: datetime, until: datetime
    ) -> int:
        """How far `counter` rose on the port in reports observed within [since, until]."""
        rows = self.s.scalars(
            select(m.Event.payload).where(
                m.Event.node == node,
                m.Event.kind == "counter",
                m.Event.device == device,
                m.Event.port == port,
                m.Event.observed_at >= since,
                m.Event.observed_at <= until,
            )
        )
        total = 0
        for payload in rows:
            if payload.get("counter") == counter and isinstance(payload.get("delta"), int):
                total += payload["delta"]
        return total
