"""Topology loss: a GPU or RNIC the node had and has no more is a fault on it.

Opened when a registration leaves the part out, or at once when the agent reports
it gone from sysfs (a ``device_lost`` event, which may arrive before or after the
smaller registration: the fault is opened once). The fault keeps the lost part's
description, so paths are still planned on the topology the job was placed on,
with that part failed; registering the part again closes it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.engine.fabric import WHOLE_DEVICE, FaultKind
from scheduler_svc.store import models as m
from scheduler_svc.store.faults import FaultRepo
from scheduler_svc.store.nodes import NodeRepo


def gpu_was(g: m.Gpu) -> dict[str, Any]:
    """A lost GPU as the planner needs it (``engine.paths.Gpu``'s fields)."""
    return {
        "index": g.index,
        "pci": g.pci,
        "numa": g.numa,
        "pcie_switch": g.pcie_switch,
        "root_complex": g.root_complex,
        "nvlink": g.nvlink,
    }


def rnic_port_was(r: m.Rnic) -> dict[str, Any]:
    """A lost RNIC port as the planner needs it (``engine.paths.Rnic``'s fields), down."""
    return {
        "name": r.name,
        "port": r.port,
        "pci": r.pci,
        "numa": r.numa,
        "pcie_switch": r.pcie_switch,
        "root_complex": r.root_complex,
        "rate_gbps": r.rate_gbps,
        "switch": r.switch,
        "rail": r.rail,
        "state": "DOWN",
        "kind": r.kind,
        "physfn": r.physfn,
        "members": list(r.members or ()),
    }


def reported_lost(
    session: Session,
    node: str,
    *,
    device: str | None,
    gpu: int | None,
    at: datetime,
    event_id: str,
    pci: object = None,
) -> m.Fault | None:
    """The fault an agent's ``device_lost`` report opens: on the part as registered. None
    when the part is not registered, when the node registered after the report was
    observed (the registration says what is there now), when the GPU at that index has
    another address than the one reported (``pci``) or when its loss is open already."""
    row = NodeRepo(session).get(node)
    if row is None or row.updated_at > at:
        # Registered after the agent saw it gone (it came back, or the smaller
        # registration came first): the registration is the newer word.
        return None
    if gpu is not None:
        g = next((g for g in row.gpus if g.index == gpu), None)
        if g is None or (pci is not None and pci != g.pci):
            # Not the GPU registered at that index (the agent's indexes follow bus order).
            return None
        return _open(
            session,
            node,
            f"gpu{gpu}",
            gpu,
            kind=FaultKind.GPU_LOST,
            now=at,
            detail={"was": gpu_was(g)},
            first_event_id=event_id,
        )
    ports = [rnic_port_was(r) for r in row.rnics if r.name == device]
    if device is None or not ports:
        return None
    return _open(
        session,
        node,
        device,
        WHOLE_DEVICE,
        kind=FaultKind.RNIC_LOST,
        now=at,
        detail={"ports": ports},
        first_event_id=event_id,
    )


def close_returned(
    session: Session,
    name: str,
    new_gpus: set[int],
    new_rnics: set[tuple[str, int]],
    *,
    now: datetime,
) -> bool:
    """Close the node's losses whose part is registered again, and its unreachability (its
    agent is back); whether any closed."""
    faults = FaultRepo(session)
    touched = False
    for f in faults.unresolved([name]):
        back = (f.kind == FaultKind.GPU_LOST and f.port in new_gpus) or (
            f.kind == FaultKind.RNIC_LOST and any(d == f.device for d, _ in new_rnics)
        )
        if back or f.kind == FaultKind.UNREACHABLE:
            # Registered again (or its agent is back): the loss is over.
            faults.close(f, now, "registered again", None)
            touched = True
    return touched


def gpus_lost(
    session: Session, name: str, old_gpus: dict[int, m.Gpu], new_gpus: set[int], *, now: datetime
) -> bool:
    """A fault for each GPU the node had and registers no more; whether any opened."""
    touched = False
    for index, g in sorted(old_gpus.items()):
        if index not in new_gpus:
            opened = _open(
                session,
                name,
                f"gpu{index}",
                index,
                kind=FaultKind.GPU_LOST,
                now=now,
                detail={"was": gpu_was(g)},
            )
            touched |= opened is not None
    return touched


def rnics_lost(
    session: Session,
    name: str,
    old_rnics: dict[tuple[str, int], m.Rnic],
    new_rnics: set[tuple[str, int]],
    *,
    now: datetime,
) -> bool:
    """A fault for each RNIC the node had and registers no more (with every port it had);
    whether any opened."""
    touched = False
    gone: dict[str, list[dict[str, Any]]] = {}
    for (dev, _port), r in sorted(old_rnics.items()):
        if not any(d == dev for d, _ in new_rnics):
            gone.setdefault(dev, []).append(rnic_port_was(r))
    for dev, ports in gone.items():
        opened = _open(
            session,
            name,
            dev,
            WHOLE_DEVICE,
            kind=FaultKind.RNIC_LOST,
            now=now,
            detail={"ports": ports},
        )
        touched |= opened is not None
    return touched


def _open(
    session: Session,
    node: str,
    device: str,
    port: int,
    *,
    kind: FaultKind,
    now: datetime,
    detail: dict[str, Any],
    first_event_id: str | None = None,
) -> m.Fault | None:
    fault = FaultRepo(session).open_if_new(
        m.Fault(
            node=node,
            device=device,
            port=port,
            kind=kind.value,
            opened_at=now,
            last_error_at=now,
            # The node is the row's own column: a 253-character name must not overflow this.
            first_event_id=first_event_id or f"registration:{now.isoformat()}",
            detail=detail,
        )
    )
    if fault is not None:
        metrics.FAULTS_OPENED.labels(kind=kind.value).inc()
    return fault
