"""The queries a pass makes for commands (store/commands.py), row for row.

A pass asks for a job's or a communicator's commands of some kinds in some states,
for an incarnation's commands of a kind, for every row of some switch points, and for a
communicator's highest epoch. Each
answer must hold exactly the rows its filters name, in command order (the rows come
back from SQL in index order, which is not command order), on both stores.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import event
from sqlalchemy.orm import Session

from scheduler_svc.services import commands
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


def test_an_incarnations_commands_of_a_kind_in_every_state(session: Session) -> None:
    """ROWS are the first incarnation's; the second's failovers, stored after them, are
    its own, whatever their state."""
    ids = _stored(session)
    for state in ("superseded", "issued"):
        row = m.Command(
            node="n9", job_id="j", kind="failover", comm_id=5, epoch=8, state=state,
            ranks=[9], created_at=NOW, incarnation=2,
        )  # fmt: skip
        session.add(row)
        session.flush()
        ids.append(row.command_id)
    repo = CommandRepo(session)
    assert _rows(repo.incarnation_commands("j", 1, "failover"), ids) == [0, 1, 3, 6, 7]
    assert _rows(repo.incarnation_commands("j", 2, "failover"), ids) == [8, 9]
    assert _rows(repo.incarnation_commands("j", 1, "balance"), ids) == [4]
    assert _rows(repo.incarnation_commands("other", 1, "failover"), ids) == [5]
    assert repo.incarnation_commands("j", 3, "failover") == []


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


def test_who_left_their_primary_is_read_from_this_incarnations_failovers(
    session: Session,
) -> None:
    """A refused fail-back asks which of its ranks this incarnation moved: the newest
    FAILOVER of each, unless withdrawn (superseded) or refused (failed). The first
    incarnation's failovers, which moved ranks 0 and 1 too, are not even loaded."""
    session.add(job("j"))
    session.flush()
    rows = [  # (incarnation, state, ranks), in command order
        (1, "applied", [0, 1, 2]),
        (2, "applied", [0]),
        (2, "applied", [1]),
        (2, "superseded", [1]),  # the newest for rank 1: withdrawn, never reached it
        (2, "failed", [3]),
    ]
    for i, (incarnation, state, ranks) in enumerate(rows):
        session.add(
            m.Command(
                node="n0", job_id="j", kind="failover", comm_id=0, epoch=i + 1, state=state,
                ranks=ranks, created_at=NOW, incarnation=incarnation,
            )
        )  # fmt: skip
    session.flush()
    the_job = session.get(m.Job, "j")
    assert the_job is not None
    the_job.incarnation = 2
    session.flush()
    session.expunge_all()
    loaded: list[int] = []

    def seen(target: m.Command, _: object) -> None:
        loaded.append(target.incarnation)

    event.listen(m.Command, "load", seen)
    try:
        the_job = session.get(m.Job, "j")
        assert the_job is not None
        assert commands.left_their_primary(session, the_job, {0, 1, 2, 3}) == {0}
    finally:
        event.remove(m.Command, "load", seen)
    assert loaded == [2, 2, 2, 2]
