"""Reachability is a level: a node held unreachable is reachable again once its agent is heard.

An UNREACHABLE fault (`acks.cannot_move`: commands to the node went unacknowledged past
their deadline, or its ranks could not move) clears by its rule (engine/fabric.py,
ClearRule.CONTACT) when the node's own agent reaches the service after it opened: a
long-poll or a command stream that arrives, or an acknowledgement. A look that a waiting
poll or an open stream takes when woken is no such contact: its request came before, and
its agent may have gone since (a half-open connection answers nothing). A fleet token
polling for the node is not its agent either (api/commands.py names who counts).

The clearing is evidence like the others: the fault is closed with who was heard and
how, and the jobs on the node are reconciled under the fabric without it, so what they
left on backup fails back by its own evidence's damped rule, and an incarnation posted
again starts on the node as on any other.

It costs idle polls nothing they did not already pay: a poll whose node has no such
fault writes nothing, and the read is the poll's one look (CommandRepo.look: its
commands and this fault in one round trip, on indexes). The look is skipped where the
node's last look found nothing and nothing woke it since, which still holds: opening the
fault wakes the node's polls as a command does (`notify_nodes`), and a look that finds
the fault open is never counted as empty.
"""

from __future__ import annotations

import enum
import logging
from datetime import datetime

from sqlalchemy.orm import Session

from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.services import reconciler
from scheduler_svc.store import models as m
from scheduler_svc.store.faults import FaultRepo
from scheduler_svc.store.jobs import JobRepo

log = logging.getLogger(__name__)


class How(enum.StrEnum):
    """How an agent was heard from (the label of railover_nodes_reachable_again_total)."""

    POLL = "poll"
    STREAM = "stream"
    ACK = "ack"


def heard_from(
    session: Session, node: str, how: How, by: str, *, now: datetime, settings: Settings
) -> list[m.Fault]:
    """The node's agent reached the service (`by` says who and what it did): its UNREACHABLE
    fault, if one is open, clears and the jobs on the node are reconciled. Returns what
    closed; nothing is written when nothing was open."""
    repo = FaultRepo(session)
    faults = list(repo.open_unreachable(node))
    for f in faults:
        # The contact is the rule's evidence (cleared_at, which close stamps) and its record:
        # who was heard, and how; resolved_by stays empty, as for every rule's clearing.
        repo.close(f, now, f"reachable again: {by}", None)
        metrics.NODES_REACHABLE_AGAIN.labels(how=how.value).inc()
        log.info("node %s is reachable again (fault %d): %s", node, f.id, by)
    if faults:
        session.flush()
        reconciler.reconcile_jobs(session, JobRepo(session).job_ids_on_node(node), now, settings)
    return faults
