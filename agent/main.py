"""``railover-agent``: one process, configured only by RAILOVER_AGENT_* variables."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from pydantic import ValidationError

from agent.config import AgentSettings, describe_errors
from agent.railmap import RailMapError
from agent.runner import Agent

log = logging.getLogger("agent")


async def _serve(agent: Agent) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    await agent.run()


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("RAILOVER_AGENT_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = AgentSettings()
    except ValidationError as exc:
        print(f"railover-agent: refusing to start:\n{describe_errors(exc)}", file=sys.stderr)
        sys.exit(2)
    try:
        agent = Agent(settings)
    except (RailMapError, RuntimeError, OSError) as exc:
        # A broken rail map, an unwritable spool, a second agent on the same
        # spool: nothing a restart loop would fix, so say so plainly.
        print(f"railover-agent: refusing to start: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        asyncio.run(_serve(agent))
    except Exception:
        log.exception("railover-agent stopped on a fatal error")
        sys.exit(1)


if __name__ == "__main__":
    main()
