"""Degradation as evidence: a port's rate, a PCIe link and error counters open, refresh
and restore one DEGRADED fault per part.

- `port_rate`: the port's newest rate by observation time, against the rate it
  registered with (or the rate its open degradation was measured against);
- `pcie_degraded` on an RNIC: its link's current width x speed against its maximum (a
  report at full width and speed restores it);
- `counter`: a watched error counter (RAILOVER_DEGRADED_COUNTER_LIMITS) that rose by more
  than its limit within RAILOVER_DEGRADED_WINDOW_S, planned at
  RAILOVER_DEGRADED_ERROR_SHARE of the port's bandwidth.

A rate or a PCIe link is a level: a report observed before the newest one of its kind on
that part is history and changes nothing, so a late report of the old rate never
reopens what a newer one restored. Each cause is kept in the fault's detail (`causes`:
its share, its measured figure, whether its level still shows it, when); the fault
clears by the quiet rule once no level shows it (engine/fabric.py). A part that has
failed (a link down, a fatal error) carries that fault instead: a failure on a degraded
part closes the degradation (`make_room`). Nothing is decided here: the touched nodes are
returned, and their jobs are reconciled like any report's.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.api.schemas.events import EventIn, EventKind
from scheduler_svc.config import Settings
from scheduler_svc.engine.fabric import WHOLE_DEVICE, FaultKind
from scheduler_svc.store import models as m
from scheduler_svc.store.degradation import DegradationRepo
from scheduler_svc.store.faults import EventRepo, FaultRepo
from scheduler_svc.store.nodes import NodeRepo

KINDS = (EventKind.PORT_RATE, EventKind.PCIE_DEGRADED, EventKind.COUNTER)
RATE, PCIE, COUNTERS = "rate", "pcie", "counters"


def record(session: Session, e: EventIn, settings: Settings) -> tuple[set[str], m.Fault | None]:
    """Record one report's degradation evidence: the nodes it touches, the fault it opened."""
    if e.device is None:
        return set(), None  # a GPU's PCIe link: kept as a report, no RNIC to rebalance
    if e.kind == EventKind.PORT_RATE and e.port is not None and e.rate_gbps is not None:
        return _rate(session, e, e.port, e.rate_gbps)
    if e.kind == EventKind.PCIE_DEGRADED:
        return _pcie(session, e)
    if e.kind == EventKind.COUNTER and e.counter is not None:
        return _counter(session, e, settings)
    return set(), None


def _rate(session: Session, e: EventIn, port: int, rate: float) -> tuple[set[str], m.Fault | None]:
    assert e.device is not None
    repo = DegradationRepo(session)
    if repo.newer_report(
        e.node, e.kind.value, device=e.device, port=port, at=e.observed_at, event_id=e.event_id
    ):
        return set(), None  # history: the newer report is the port's rate
    baseline = repo.registered_rate(e.node, e.device, port) or 0.0
    open_ = FaultRepo(session).open_on_component(e.node, e.device, port)
    if open_ is not None and open_.kind == FaultKind.DEGRADED.value:
        was = (open_.detail.get("causes") or {}).get(RATE) or {}
        baseline = max(baseline, float(was.get("of_gbps") or 0.0))
    if baseline <= 0:
        return set(), None  # registered without a rate: nothing to measure against
    figure = f"{e.node}/{e.device}/{port} at {rate:g} of {baseline:g} Gb/s (port rate)"
    cause = {"share": min(1.0, rate / baseline), "of_gbps": baseline}
    return _level(session, e, port, name=RATE, degraded=rate < baseline, cause=cause, figure=figure)


def _pcie(session: Session, e: EventIn) -> tuple[set[str], m.Fault | None]:
    assert e.device is not None
    d = e.detail
    cw, mw = d.get("current_width"), d.get("max_width")
    cs, ms = d.get("current_speed_gts"), d.get("max_speed_gts")
    figures = (cw, mw, cs, ms)
    if not all(isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in figures):
        return set(), None  # not a measurement the service can read
    assert isinstance(cw, int | float)
    assert isinstance(mw, int | float)
    assert isinstance(cs, int | float)
    assert isinstance(ms, int | float)
    if DegradationRepo(session).newer_report(
        e.node, e.kind.value, device=e.device, port=None, at=e.observed_at, event_id=e.event_id
    ):
        return set(), None
    figure = f"{e.node}/{e.device} PCIe x{cw:g} at {cs:g} GT/s of x{mw:g} at {ms:g} GT/s"
    cause = {"share": min(1.0, (cw * cs) / (mw * ms))}
    degraded = cw < mw or cs < ms
    return _level(
        session, e, WHOLE_DEVICE, name=PCIE, degraded=degraded, cause=cause, figure=figure
    )


def _counter(session: Session, e: EventIn, settings: Settings) -> tuple[set[str], m.Fault | None]:
    assert e.device is not None
    assert e.counter is not None
    limit = settings.counter_limits().get(e.counter)
    if limit is None:
        return set(), None
    port = e.port or 1
    window = settings.degraded_window_s
    since = e.observed_at - timedelta(seconds=window)
    rise = DegradationRepo(session).counter_rise(
        e.node, e.device, port=port, counter=e.counter, since=since, until=e.observed_at
    )
    if rise <= limit:
        return set(), None
    figure = f"{e.node}/{e.device}/{port} {e.counter} +{rise} in {window:g} s (limit {limit})"
    cause = {"share": settings.degraded_error_share}
    return _open_or_refresh(
        session, e, port, name=COUNTERS, cause=cause | {"level": False}, figure=figure
    )


def _level(
    session: Session,
    e: EventIn,
    port: int,
    *,
    name: str,
    degraded: bool,
    cause: dict[str, Any],
    figure: str,
) -> tuple[set[str], m.Fault | None]:
    """A level report: degrading opens or refreshes the cause, a restored one ends it."""
    assert e.device is not None
    if degraded:
        return _open_or_refresh(
            session, e, port, name=name, cause=cause | {"level": True}, figure=figure
        )
    row = FaultRepo(session).open_on_component(e.node, e.device, port)
    if row is None or row.kind != FaultKind.DEGRADED.value:
        return set(), None
    causes = dict(row.detail.get("causes") or {})
    was = causes.get(name)
    if not was or not was.get("level"):
        return set(), None
    # Restored: the share it was planned at holds until the fault clears (quiet period).
    causes[name] = was | {"level": False, "restored": figure, "at": e.observed_at.isoformat()}
    row.detail = {**row.detail, "causes": causes}
    return {e.node}, None


def _open_or_refresh(
    session: Session, e: EventIn, port: int, *, name: str, cause: dict[str, Any], figure: str
) -> tuple[set[str], m.Fault | None]:
    assert e.device is not None
    faults = FaultRepo(session)
    entry = cause | {"figure": figure, "at": e.observed_at.isoformat()}
    row = faults.open_on_component(e.node, e.device, port)
    if row is not None and row.kind != FaultKind.DEGRADED.value:
        return set(), None  # the part has failed: that fault decides
    if row is not None:
        row.detail = {**row.detail, "causes": {**(row.detail.get("causes") or {}), name: entry}}
        if row.last_error_at is None or e.observed_at > row.last_error_at:
            row.last_error_at = e.observed_at
        return {e.node}, None
    opened = faults.open_if_new(
        m.Fault(
            node=e.node,
            device=e.device,
            port=port,
            kind=FaultKind.DEGRADED.value,
            opened_at=e.observed_at,
            last_error_at=e.observed_at,
            first_event_id=e.event_id,
            detail={"causes": {name: entry}},
            switch=NodeRepo(session).switch_of(e.node, e.device, port),
        )
    )
    if opened is None:
        return set(), None
    metrics.FAULTS_OPENED.labels(kind=FaultKind.DEGRADED.value).inc()
    EventRepo(session).set_fault([e.event_id], opened.id)
    return {e.node}, opened


def make_room(session: Session, node: str, device: str, port: int, at: datetime) -> None:
    """A part that fails is no longer degraded: its degradation closes, so the failure
    opens in its place (one open fault per part)."""
    faults = FaultRepo(session)
    row = faults.open_on_component(node, device, port)
    if row is not None and row.kind == FaultKind.DEGRADED.value:
        faults.close(row, at, "superseded: the part failed", None)
        session.flush()


def evidence_fields(detail: Mapping[str, Any]) -> dict[str, Any]:
    """A DEGRADED fault's share, level, restore time and figures (from its `detail`), as
    the engine reads them."""
    causes = [c for c in (detail.get("causes") or {}).values() if isinstance(c, dict)]
    restored = [datetime.fromisoformat(c["at"]) for c in causes if not c.get("level") and "at" in c]
    return {
        "share": min((float(c.get("share", 1.0)) for c in causes), default=1.0),
        "degraded_level": any(bool(c.get("level")) for c in causes),
        "recovered_at": max(restored, default=None),
        "note": "; ".join(str(c.get("figure", "")) for c in causes),
    }
