"""Commands for the CCL processes of a node, fetched by its agent: a long-poll, or a stream.

The stream (`GET /v1/nodes/{node}/commands/stream`, server-sent events) is one
response per agent that stays open: an idle fleet then costs a keepalive line per
agent every heartbeat, not a request per agent every wait. The long-poll stays for
agents that cannot hold a stream (a proxy that buffers, an older agent). Both look
at the store the same way (`_look`): when they start and when they are woken, never
on a timer.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from scheduler_svc import metrics
from scheduler_svc.api import routing
from scheduler_svc.api.deps import (
    AgentAuth,
    NowDep,
    Principal,
    SessionDep,
    SettingsDep,
    still_authorized,
)
from scheduler_svc.api.jobs import command_out
from scheduler_svc.api.schemas.commands import (
    AckIn,
    CommandList,
    CommandOut,
    StreamEnd,
    StreamEndReason,
    StreamReady,
)
from scheduler_svc.api.schemas.fields import Id64, Name
from scheduler_svc.api.schemas.tokens import Role
from scheduler_svc.config import Settings
from scheduler_svc.errors import (
    VALIDATION,
    Forbidden,
    NotFound,
    Unauthorized,
    Unprocessable,
    responses,
)
from scheduler_svc.services import acks, reach, registry
from scheduler_svc.services.delivery import CommandNotifier, StreamSlot
from scheduler_svc.store.commands import CommandRepo
from scheduler_svc.store.uow import Clock, Notify, unit_of_work

log = logging.getLogger(__name__)
router = routing.router(prefix="/v1", tags=["commands"])

# A waiting poll looks at the store when it starts and when it is woken, never on a timer
# (scheduler_svc/services/delivery.py: the notifier and, on PostgreSQL, the listener wake it; its
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
    # The request itself is word from the agent; a look after a wake-up is not (see reach.py).
    heard = _heard(who, node, reach.How.POLL, "polled for commands")
    while True:
        cmds = await _look(app, node, include_unacked, heard)
        heard = None
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


@dataclass(frozen=True, slots=True)
class Heard:
    """The node's own agent reached the service: how, and the record of who and what."""

    how: reach.How
    by: str


def _agent(who: Principal, node: str) -> str | None:
    """The caller as the node's agent: its agent token, or any caller of a service open on
    loopback (where agents carry no token). None for a fleet token acting for the node."""
    if who.role == Role.AGENT and who.node == node:
        return f"its agent (token {who.token_id})"
    if who.token_id is None:
        return "its agent (no token, open loopback)"
    return None


def _heard(who: Principal, node: str, how: reach.How, what: str) -> Heard | None:
    agent = _agent(who, node)
    return None if agent is None else Heard(how, f"{agent} {what}")


async def _look(
    app: FastAPI, node: str, include_unacked: bool, heard: Heard | None = None
) -> list[CommandOut]:
    """One look at the store for a node's commands, or none where it would find nothing.

    Wake-ups from before the look are answered by it; later ones end the wait after it.
    A look without unacknowledged commands may be skipped: when nothing woke the node
    since its last look found nothing (notify.py, `unchanged_since_empty`). Delivered but
    unacknowledged commands change without a wake-up, so a look for them always happens.
    With `heard` (the look a request makes as it arrives) a node held unreachable is
    reachable again (services/reach.py); a look that finds it still held is never empty.
    """
    notifier = app.state.notifier
    may_skip = not include_unacked and RECHECK_S is None
    notifier.reset(node)
    if may_skip and notifier.unchanged_since_empty(node):
        return []
    stamp = notifier.stamp(node)
    # A short transaction per look, never one held open across a wait.
    cmds, held = await run_in_threadpool(
        _take,
        app.state.read_sessionmaker,
        app.state.sessionmaker,
        node,
        include_unacked,
        app.state.clock,
        heard=heard,
        settings=app.state.settings,
        notify=app.state.notifier.notify_threadsafe,
    )
    if not cmds and not held and may_skip:
        notifier.looked_empty(node, stamp)
    return cmds


class EventStream(StreamingResponse):
    """A text/event-stream answer (server-sent events: the WHATWG HTML standard, §9.2)."""

    media_type = "text/event-stream"


def sse(event: str, data: BaseModel, event_id: int | None = None) -> bytes:
    """One server-sent event: its name, its id where it has one, its data as one JSON line."""
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return f"{head}data: {data.model_dump_json()}\n\n".encode()


KEEPALIVE = b": keepalive\n\n"
# A stream's length is drawn from [1 - STREAM_SPREAD, 1] x RAILOVER_COMMANDS_STREAM_MAX_S, so
# the streams of agents that started together do not all end (and reconnect) together.
STREAM_SPREAD = 0.1

STREAM_DOC = """Server-sent events (text/event-stream), each `data` one line of JSON:

- `ready` first: a StreamReady;
- `command`, with `id:` the command's id: a CommandOut, as the long-poll returns it;
- `end` last: a StreamEnd; reconnect at once after max_age and stopping, with backoff
  after unavailable (the store could not be read);
- a comment line `: keepalive` whenever nothing else was sent for heartbeat_s."""
# One event of the stream, as the WHATWG parser yields it (OpenAPI 3.1: `schema` of a
# text/event-stream is the schema of each event; 3.2 calls it itemSchema).
STREAM_EVENT = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": ["ready", "command", "end"]},
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {
                "oneOf": [
                    StreamReady.model_json_schema(),
                    {"$ref": "#/components/schemas/CommandOut"},
                    StreamEnd.model_json_schema(),
                ]
            },
        },
    },
}


STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": STREAM_DOC, "content": {"text/event-stream": {"schema": STREAM_EVENT}}}
}
# Refusals are JSON, as everywhere: said here, or they would take the route's media type.
for _status, _entry in (responses(Unauthorized, Forbidden) | VALIDATION).items():
    STREAM_RESPONSES[_status] = {
        "description": _entry["description"],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }


@router.get(
    "/nodes/{node}/commands/stream",
    operation_id="stream_commands",
    response_class=EventStream,
    responses=STREAM_RESPONSES,
)
async def stream_commands(
    node: Name,
    request: Request,
    who: AgentAuth,
    heartbeat_s: float = Query(
        30.0, ge=1, le=300, description="Longest silence on the stream: a keepalive after it"
    ),
    include_unacked: bool = Query(
        True,
        description="First also send commands delivered before but not acknowledged (any "
        "reconnect: a command sent into a stream that broke was delivered, not received)",
    ),
) -> EventStream:
    """This node's commands as they are issued, on one response that stays open.

    Each command is sent once, when it is issued (or, with include_unacked, at the start
    if it was delivered before and not acknowledged). The stream ends after
    RAILOVER_COMMANDS_STREAM_MAX_S (a little less, spread), or when the service stops;
    the token is checked when it opens."""
    who.require_node(node)
    app = request.app
    # The first look comes before the answer starts: a store that cannot be read answers
    # 503, as a poll would, rather than a stream that ends at once. It is the one look that
    # counts as word from the agent: later ones are the stream's, woken (see reach.py).
    heard = _heard(who, node, reach.How.STREAM, "opened its command stream")
    first = await _look(app, node, include_unacked, heard)
    return EventStream(
        _stream(request, who, node, first, heartbeat_s),
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _stream(
    request: Request, who: Principal, node: str, cmds: list[CommandOut], heartbeat_s: float
) -> AsyncIterator[bytes]:
    app = request.app
    notifier = app.state.notifier
    loop = asyncio.get_running_loop()
    lasts = app.state.settings.commands_stream_max_s * (1 - STREAM_SPREAD * random.random())  # noqa: S311
    ends = loop.time() + lasts
    reason: StreamEndReason | None = None  # None: the client left first
    slot, replaced = app.state.streams.open(node)
    if replaced:
        notifier.notify([node])  # the replaced streams end at their next turn
    metrics.COMMAND_STREAMS.inc()
    try:
        yield sse("ready", StreamReady(heartbeat_s=heartbeat_s, ends_in_s=round(lasts, 3)))
        beat = loop.time() + heartbeat_s
        while True:
            for c in cmds:
                yield sse("command", c, c.command_id)
            now = loop.time()
            if cmds:
                beat = now + heartbeat_s
            elif now >= beat:
                # The token again at each heartbeat: revoked or expired ends the stream.
                if not await run_in_threadpool(still_authorized, request, who):
                    reason = "unauthorized"
                    break
                yield KEEPALIVE
                beat = now + heartbeat_s
            reason = _ended(notifier, slot, now, ends)
            if reason is not None:
                break
            await notifier.wait(node, min(beat, ends) - now)
            reason = _ended(notifier, slot)
            if reason is not None:
                break
            # Woken, or a heartbeat's end: a look, or none where it would find nothing (while
            # the listener or the watermark holds, nothing unannounced can have come). The
            # token first: a revoked one must not take the node's commands.
            if not await run_in_threadpool(still_authorized, request, who):
                reason = "unauthorized"
                break
            try:
                cmds = await _look(app, node, include_unacked=False)
            except (OperationalError, InterfaceError) as exc:
                log.warning("command stream of %s: store unavailable: %s", node, exc)
                reason = "unavailable"
                break
        yield sse("end", StreamEnd(reason=reason))
    finally:
        app.state.streams.close(node, slot)
        metrics.COMMAND_STREAMS.dec()
        metrics.COMMAND_STREAM_ENDS.labels(reason or "client_gone").inc()


def _ended(
    notifier: CommandNotifier, slot: StreamSlot, now: float = 0.0, ends: float | None = None
) -> StreamEndReason | None:
    """Why the stream ends now, if it does: the service stops, a newer stream of the node
    took its slot, or (`ends` given) its time is up."""
    if notifier.closing:
        return "stopping"
    if slot.replaced:
        return "replaced"
    if ends is not None and now >= ends:
        return "max_age"
    return None


def _take(
    reads: sessionmaker[Session],
    writes: sessionmaker[Session],
    node: str,
    include_unacked: bool,
    clock: Clock,
    *,
    heard: Heard | None,
    settings: Settings,
    notify: Notify,
) -> tuple[list[CommandOut], bool]:
    """The node's commands, taken; and whether the node is still held unreachable."""
    # Most looks find nothing: look without the write lock, take it only to mark delivery,
    # or to clear the node's unreachable fault when its agent is the one looking.
    with reads() as session:
        look = registry.look_for_node(session, node, include_unacked)
    clears = look.unreachable and heard is not None
    if not look.pending and not clears:
        return [], look.unreachable
    # Clearing reconciles the node's jobs, which may command other nodes: wake theirs too.
    with unit_of_work(writes, notify) as session:
        now = clock()
        if clears and heard is not None:
            reach.heard_from(session, node, heard.how, heard.by, now=now, settings=settings)
        cmds = registry.take_commands(session, node, now, include_unacked)
        others = registry.other_jobs_ranks(session, node, cmds)
        return [
            command_out(c).model_copy(update={"other_jobs_ranks": others[c.command_id]})
            for c in cmds
        ], False


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
    agent = _agent(who, body.node)
    return command_out(acks.ack_command(session, command_id, body, now, settings, agent=agent))
