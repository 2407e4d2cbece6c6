"""Event types: CloudEvents `type` values, reverse-DNS as the spec recommends."""

from __future__ import annotations

import enum


class EventType(enum.StrEnum):
    DECISION_CREATED = "io.railover.decision.created"
    # io.railover.command.<state>: delivered | applied | failed | superseded
    COMMAND_DELIVERED = "io.railover.command.delivered"
    COMMAND_APPLIED = "io.railover.command.applied"
    COMMAND_FAILED = "io.railover.command.failed"
    COMMAND_SUPERSEDED = "io.railover.command.superseded"
    SWITCH_FAULT = "io.railover.switch_fault.detected"
    MAINTENANCE_FLAG = "io.railover.maintenance.flagged"
    # An operator cleared a flag (DELETE /v1/maintenance-flags/{id}): the port is repaired.
    MAINTENANCE_CLEARED = "io.railover.maintenance.cleared"
    # Planned maintenance (POST /v1/maintenance): announced, its window opened, over
    # (at its end or cancelled). data: the window, its target and would_restart.
    MAINTENANCE_SCHEDULED = "io.railover.maintenance.scheduled"
    MAINTENANCE_STARTED = "io.railover.maintenance.started"
    MAINTENANCE_ENDED = "io.railover.maintenance.ended"
    # FlowCheck: a checkpoint node could not rebuild an iteration; the job should take a
    # normal checkpoint at its next one. data: after_iteration, failed_iterations, ranks.
    JOB_CHECKPOINT_REQUESTED = "io.railover.job.checkpoint_requested"


def command_type(state: str) -> str:
    return f"io.railover.command.{state}"
