"""Plans are shared across transactions only once the transaction that made them commits.

A plan is cached by (store, node, topology version, registration time, lost parts' fault
ids, cap). A transaction that rolls back leaves that key to the next: a registration
rolled back gives its topology version to the next registration of the node, and SQLite
gives a rolled-back fault's id to the next fault. A plan made in the rolled-back
transaction must not answer for the node as it is then.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from railover_testing.cluster_shapes import hgx_node
from scheduler_svc.api.schemas.nodes import NodeIn
from scheduler_svc.config import Settings
from scheduler_svc.engine.paths import plan_node
from scheduler_svc.services import fabric, losses, registry
from scheduler_svc.store import models as m
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.faults import FaultRepo, OpenFault
from scheduler_svc.store.nodes import NodeRepo
from scheduler_svc.store.uow import commit

NOW = datetime(2026, 12, 1, tzinfo=UTC)
LATER = NOW + timedelta(minutes=1)


@pytest.fixture
def sessions(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> Iterator[sessionmaker[Session]]:
    # A cache of its own: the stores of earlier tests had nodes of these names and times.
    monkeypatch.setattr(fabric, "PLANS", fabric.PlanCache())
    db = make_engine(settings.db_url)
    factory = make_sessionmaker(db)
    with factory() as s:
        registry.register_node(s, "n1", NodeIn.model_validate(hgx_node()), NOW, settings)
        commit(s)
    try:
        yield factory
    finally:
        db.dispose()


def lost_as_read(s: Session, fault: m.Fault) -> OpenFault:
    """A lost part's fault as the evidence reads it (the plans are asked with these)."""
    (read,) = [f for f in FaultRepo(s).unresolved_at_their_ports(["n1"]) if f.id == fault.id]
    return read


def lose_gpu(s: Session, settings: Settings, gpu: int) -> OpenFault:
    """The agent reports GPU `gpu` gone, then the node registers again without it (at
    the same instant whichever GPU it is: a manual clock, or a retried registration)."""
    fault = losses.reported_lost(s, "n1", device=None, gpu=gpu, at=LATER, event_id=f"lost-{gpu}")
    assert fault is not None
    body = hgx_node()
    body["gpus"] = [g for g in body["gpus"] if g["index"] != gpu]
    registry.register_node(s, "n1", NodeIn.model_validate(body), LATER, settings)
    s.flush()
    return lost_as_read(s, fault)


def plan_read(s: Session, settings: Settings, lost: list[OpenFault]) -> object:
    _, plans = fabric.PLANS.get(s, {"n1"}, settings.backup_cap_per_switch, {"n1": lost})
    return plans["n1"]


def plan_of(s: Session, settings: Settings, lost: list[OpenFault]) -> object:
    node = NodeRepo(s).get_many(["n1"])["n1"]
    return plan_node(fabric.node_topology(node, lost), settings.backup_cap_per_switch)


def read_topologies(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Count the topology reads: a plan made (a miss) reads the node's rows."""
    reads: list[object] = []
    real = NodeRepo.topology_rows

    def counted(repo: NodeRepo, names: object) -> object:
        reads.append(names)
        return real(repo, names)  # type: ignore[arg-type]

    monkeypatch.setattr(NodeRepo, "topology_rows", counted)
    return reads


def recable(s: Session, settings: Settings, pcie_switch: str) -> None:
    """The node registers again with mlx5_1 behind another PCIe switch: its GPUs' backups
    change, and its topology version is the next one, whichever cabling it is."""
    body = hgx_node()
    body["rnics"][1]["pcie_switch"] = pcie_switch
    registry.register_node(s, "n1", NodeIn.model_validate(body), LATER, settings)
    s.flush()


def test_a_plan_made_by_a_transaction_rolled_back_is_not_the_next_ones(
    sessions: sessionmaker[Session], settings: Settings
) -> None:
    """The rolled-back registration's version is taken again by the next, cabled another
    way: the key is the same, the node is not."""
    with sessions() as s:
        recable(s, settings, "0000:21:00.0")
        version = NodeRepo(s).versions({"n1"})
        rolled_back = plan_read(s, settings, [])
        assert rolled_back == plan_of(s, settings, [])
        s.rollback()
    with sessions() as s:
        recable(s, settings, "0000:31:00.0")
        assert NodeRepo(s).versions({"n1"}) == version  # the same key...
        assert plan_of(s, settings, []) != rolled_back  # ...for another node
        assert plan_read(s, settings, []) == plan_of(s, settings, [])


def test_a_plan_is_made_once_a_transaction_and_shared_when_it_commits(
    sessions: sessionmaker[Session], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = read_topologies(monkeypatch)
    with sessions() as s:
        gone = lose_gpu(s, settings, 2)
        first = plan_read(s, settings, [gone])
        assert plan_read(s, settings, [gone]) is first  # the transaction's own, not read again
        assert len(reads) == 1
        commit(s)
    with sessions() as s:
        (again,) = [f for f in s.query(m.Fault).all() if f.device == "gpu2"]
        assert plan_read(s, settings, [lost_as_read(s, again)]) == first
    assert len(reads) == 1  # committed: the cache answers the next transaction


def test_a_plan_made_under_a_savepoint_rolled_back_is_made_again(
    sessions: sessionmaker[Session], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit runs each request in a savepoint of one transaction: one that fails
    is rolled back to its savepoint, and what it planned goes with it."""
    reads = read_topologies(monkeypatch)
    with sessions() as s:
        s.connection()  # the outer transaction
        savepoint = s.begin_nested()
        gone = lose_gpu(s, settings, 4)
        plan_read(s, settings, [gone])
        savepoint.rollback()
        other = lose_gpu(s, settings, 5)
        assert plan_read(s, settings, [other]) == plan_of(s, settings, [other])
        assert len(reads) == 2
        s.rollback()
    with sessions() as s:
        other = lose_gpu(s, settings, 5)
        plan_read(s, settings, [other])
        assert len(reads) == 3  # nothing was committed, so nothing was shared
