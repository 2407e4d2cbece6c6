"""Commands for the CCL processes of a node, fetched by its agent with a long-poll."""

from __future__ import annotations

import asyncio

from fastapi import Query, Request
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from scheduler_svc.api import routing
from scheduler_svc.api.jobs import command_out
from scheduler_svc.deps import AgentAuth, NowDep, SessionDep, SettingsDep
from scheduler_svc.errors import (
    VALIDATION,
    Forbidden,
    NotFound,
    Unauthorized,
    Unprocessable,
    responses,
)
from scheduler_svc.schemas import AckIn, CommandList, CommandOut, Id64, Name, Role
from scheduler_svc.services import acks, registry
from scheduler_svc.store.repositories import CommandRepo
from scheduler_svc.store.uow import Clock, unit_of_work

router = routing.router(prefix="/v1", tags=["commands"])

# A waiting poll looks at the store when it starts and when it is woken, never on a timer
# (scheduler_svc/notify.py: the notifier and, on PostgreSQL, the listener wake it; its
# deadline is the backstop). Set, a poll also re-reads the store this often: the old
# path, kept only so benchmarks/bench_idle_polls.py can measure it beside the new one.
RECHECK_S: float | None = None


@router.get(
    "/nodes/{node}/commands",
    operation_id="poll_commands",
    responses=responses(Unauthorized, Forbidden) | VALIDATION,
)
async def poll_commands(
    node: Name,
    request: Request,
    who: AgentAuth,
    wait_s: float = Query(0.0, ge=0, le=120, description="Long-poll: wait up to this long"),
    include_unacked: bool = Query(
        False, description="Also commands delivered before but not acknowledged (agent start)"
    ),
) -> CommandList:
    """Commands not yet delivered to this node; waits up to wait_s for one to appear."""
    who.require_node(node)
    app = request.app
    notifier = app.state.notifier
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(wait_s, app.state.settings.commands_wait_max_s)
    # Delivered but unacknowledged commands change without a wake-up: always looked for.
    may_skip = not include_unacked and RECHECK_S is None
    while True:
        # Wake-ups from before this look are answered by it; later ones end the wait below.
        notifier.reset(node)
        if may_skip and notifier.unchanged_since_empty(node):
            # A renewal with nothing new since the last empty look (notify.py): that look's
            # answer stands, and a wake-up from here on ends the wait as usual.
            cmds: list[CommandOut] = []
        else:
            stamp = notifier.stamp(node)
            # A short transaction per look, never one held open across the wait.
            cmds = await run_in_threadpool(
                _take,
                app.state.read_sessionmaker,
                app.state.sessionmaker,
                node,
                include_unacked,
                app.state.clock,
            )
            if not cmds and may_skip:
                notifier.looked_empty(node, stamp)
        remaining = deadline - loop.time()
        if cmds or remaining <= 0 or notifier.closing:
            return CommandList(commands=cmds)
        await notifier.wait(node, remaining if RECHECK_S is None else min(RECHECK_S, remaining))
        if notifier.closing:
            # The service is stopping (notify.CommandNotifier.close): no look, the agent's
            # next poll, sent at once, looks wherever it lands.
            return CommandList(commands=[])
        if RECHECK_S is None and loop.time() >= deadline:
            # Not woken (or only just at the deadline): the agent's next poll, sent at
            # once, is the next look.
            return CommandList(commands=[])


def _take(
    reads: sessionmaker[Session],
    writes: sessionmaker[Session],
    node: str,
    include_unacked: bool,
    clock: Clock,
) -> list[CommandOut]:
    # Most looks find nothing: look without the write lock, take it only to mark delivery.
    with reads() as session:
        if not registry.has_pending_commands(session, node, include_unacked):
            return []
    with unit_of_work(writes) as session:
        cmds = registry.take_commands(session, node, clock(), include_unacked)
        return [command_out(c) for c in cmds]


@router.post(
    "/commands/{command_id}/acks",
    operation_id="ack_command",
    responses=responses(Unauthorized, Forbidden, NotFound, Unprocessable) | VALIDATION,
)
def ack_command(
    command_id: Id64,
    *,
    body: AckIn,
    session: SessionDep,
    who: AgentAuth,
    settings: SettingsDep,
    now: NowDep,
) -> CommandOut:
    """Acknowledge a command for one rank (or the whole node): delivered, applied, failed,
    or too_late with the rank's ops_done."""
    who.require_node(body.node)
    if who.role == Role.AGENT:
        cmd = CommandRepo(session).get(command_id)
        if cmd is not None and cmd.node != who.node:
            raise Forbidden(f"command {command_id} is addressed to another node, not {who.node!r}")
    return command_out(acks.ack_command(session, command_id, body, now, settings))
