"""The queries a pass makes for commands (store/commands.py), row for row.

A pass asks for a job's or a communicator's commands of some kinds in some states,
for every row of some switch points, and for a communicator's highest epoch. Each
answer must hold exactly the rows its filters name, in command order (the rows come
back from SQL in index order, which is not command order), on both stores.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session

from scheduler_svc.store import models as m
from scheduler_svc.store.commands import CommandRepo
from tests.store.test_idempotency import job

NOW = datetime(2026, 12, 6, tzinfo=UTC)
WAITING = ["issued", "delivered"]
EVERY_KIND = ["failover", "failback", "balance", "abort"]

# (job, communicator, epoch, kind, state), stored in this order: row i gets the i-th id.
ROWS = [
    ("j", 5, 2, "failover", "issued"),  # 0
    ("j", 5, 1, "failover", "applied"),  # 1
    ("j", 7, 3, "failback", "delivered"),  # 2
    ("j", 5, 2, "failover", "delivered"),  # 3: the same switch point, another node
    ("j", 5, 4, "balance", "issued"),  # 4
    ("other", 5, 9, "failover", "issued"),  # 5: another job
    ("j", 7, 6, "failover", "issued"),  # 6
    ("j", 5, 2, "failover", "superseded"),  # 7
]


def _stored(session: Session) -> list[int]:
    session.add_all([job("j"), job("other")])
    session.flush()
    ids = []
    for i, (job_id, comm_id, epoch, kind, state) in enumerate(ROWS):
        row = m.Command(
            node=f"n{i}",
            job_id=job_id,
            kind=kind,
            comm_id=comm_id,
            epoch=epoch,
            state=state,
            ranks=[i],
            created_at=NOW,
        )
        session.add(row)
        session.flush()
        ids.append(row.command_id)
    return ids


def _rows(found: list[m.Command], ids: list[int]) -> list[int]:
    """Each command as its place in ROWS."""
    return [ids.index(c.command_id) for c in found]


def test_a_jobs_commands_of_some_kinds_in_some_states(session: Session) -> None:
    ids = _stored(session)
    repo = CommandRepo(session)
    assert _rows(repo.job_commands("j", ["failover"], WAITING), ids) == [0, 3, 6]
    assert _rows(repo.job_commands("j", ["failback"], WAITING), ids) == [2]
    assert _rows(repo.job_commands("j", ["failover"], ["applied"]), ids) == [1]
    assert _rows(repo.job_commands("j", ["failover", "balance"], ["issued"]), ids) == [0, 4, 6]
    assert _rows(repo.job_commands("other", ["failover"], WAITING), ids) == [5]
    assert repo.job_commands("j", ["abort"], WAITING) == []


def test_a_communicators_commands_of_some_kinds_in_some_states(session: Session) -> None:
    ids = _stored(session)
    repo = CommandRepo(session)
    assert _rows(repo.comm_commands("j", 5, ["failover"], WAITING), ids) == [0, 3]
    assert _rows(repo.comm_commands("j", 7, ["failover", "failback"], WAITING), ids) == [2, 6]
    assert _rows(repo.comm_commands("j", 5, ["balance"], ["issued"]), ids) == [4]
    assert _rows(repo.comm_commands("j", 5, EVERY_KIND, ["applied"]), ids) == [1]
    assert _rows(repo.comm_commands("other", 5, ["failover"], WAITING), ids) == [5]
    assert repo.comm_commands("j", 9, EVERY_KIND, WAITING) == []


def test_every_row_of_some_switch_points(session: Session) -> None:
    ids = _stored(session)
    repo = CommandRepo(session)
    assert _rows(repo.switch_points("j", "failover", {(7, 6), (5, 2)}), ids) == [0, 3, 6, 7]
    assert _rows(repo.switch_points("j", "failover", {(5, 1)}), ids) == [1]
    assert _rows(repo.switch_points("j", "failback", {(7, 3)}), ids) == [2]
    assert repo.switch_points("j", "failback", {(5, 2)}) == []  # another kind's point
    assert repo.switch_points("j", "failover", {(5, 9)}) == []  # another job's point
    assert repo.switch_points("j", "failover", set()) == []


def test_a_communicators_highest_epoch(session: Session) -> None:
    _stored(session)
    repo = CommandRepo(session)
    assert repo.max_epoch("j", 5, EVERY_KIND) == 4
    assert repo.max_epoch("j", 5, ["failover"]) == 2
    assert repo.max_epoch("j", 7, ["failover"]) == 6
    assert repo.max_epoch("j", 7, ["failback"]) == 3
    assert repo.max_epoch("other", 5, EVERY_KIND) == 9
    assert repo.max_epoch("j", 9, EVERY_KIND) == 0
