"""Telling the fleet: signed CloudEvents webhooks, Kubernetes and Slurm actions, the audit log.

Everything leaves through a persistent outbox. `emit` writes an event and one
delivery per target in the caller's transaction, so an event exists exactly
when the change that caused it was committed; the delivery worker (one per
replica) sends it afterwards, retrying until it is acknowledged.

Public API for other service modules::

    from scheduler_svc.fleet import emit, EventType
    emit(session, EventType.SWITCH_FAULT, job_id=None, subject="switch/rail0-a",
         data={"switch": "rail0-a", "nodes": ["n0", "n1"], "links": [...]})
"""

from scheduler_svc.fleet.events import (
    EventType,
    emit,
    emit_command_change,
    emit_decision,
)

__all__ = ["EventType", "emit", "emit_command_change", "emit_decision"]
