"""``railover-agent``: one process, configured only by RAILOVER_AGENT_* variables.

The only arguments are ``--help`` and ``--version``, which print and exit before
anything is created or opened. Expected failures (invalid settings, a broken rail
map, an unwritable spool, the metrics port in use) end in a line naming the problem
and one naming the fix, with exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import socket
import sys
from importlib.metadata import PackageNotFoundError, version

from pydantic import ValidationError

from agent.config import AgentSettings, describe_errors, unknown_variables
from agent.railmap import RailMapError
from agent.runner import Agent

log = logging.getLogger("agent")

EPILOG = """\
Settings are environment variables only; `railover config` lists each with its type,
default and meaning. The ones every node needs:
  RAILOVER_AGENT_SERVICE_URL   the service (https off loopback)
  RAILOVER_AGENT_TOKEN         this node's agent token
  RAILOVER_AGENT_RAIL_MAP      the file naming each port's fabric switch and rail
/healthz and /metrics are served on RAILOVER_AGENT_METRICS_PORT (9465).
"""


def _version() -> str:
    try:
        return version("railover")
    except PackageNotFoundError:  # a checkout that was never installed
        return "0+unknown"


def _parse_args(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="railover-agent",
        description="Railover's node agent: discovers GPUs, RNICs and PCIe from sysfs, "
        "watches ports and counters, reports to the service and relays its commands to "
        "the CCL plugin.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"railover-agent {_version()}")
    parser.parse_args(argv)


async def _serve(agent: Agent) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    await agent.run()


def _refuse(problem: str, fix: str) -> None:
    print(f"railover-agent: {problem}\n  fix: {fix}", file=sys.stderr)
    sys.exit(2)


def _check_metrics_port(settings: AgentSettings) -> None:
    """Say a taken port in two lines now, rather than as a traceback from the event loop."""
    if settings.metrics_port == 0:
        return
    probe = socket.socket(socket.AF_INET6 if ":" in settings.metrics_host else socket.AF_INET)
    try:
        # As the HTTP server binds it: SO_REUSEADDR, so a port in TIME_WAIT is not "in use".
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((settings.metrics_host, settings.metrics_port))
    except OSError as exc:
        where = f"{settings.metrics_host}:{settings.metrics_port}"
        if exc.errno == errno.EADDRINUSE:
            _refuse(
                f"the metrics port {where} is in use (another agent on this node?)",
                "stop the other program or set RAILOVER_AGENT_METRICS_PORT to a free port",
            )
        _refuse(
            f"cannot serve /metrics on {where}: {exc.strerror}",
            "set RAILOVER_AGENT_METRICS_HOST/RAILOVER_AGENT_METRICS_PORT to an address here",
        )
    finally:
        probe.close()


def main() -> None:
    _parse_args(sys.argv[1:])
    # Logging starts before the settings are read; a bad level is refused with them below.
    level = os.environ.get("RAILOVER_AGENT_LOG_LEVEL", "INFO").strip().upper()
    logging.basicConfig(
        level=level if level in ("DEBUG", "INFO", "WARNING", "ERROR") else "INFO",
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for warning in unknown_variables(os.environ):
        log.warning("%s", warning)
    try:
        settings = AgentSettings()
    except ValidationError as exc:
        _refuse(
            "refusing to start: " + "; ".join(describe_errors(exc).splitlines()),
            "`railover config` lists every setting with its type and default",
        )
    _check_metrics_port(settings)
    try:
        agent = Agent(settings)
    except (RailMapError, RuntimeError, OSError) as exc:
        # A broken rail map, an unwritable spool, a second agent on the same
        # spool: nothing a restart loop would fix, so say so plainly.
        _refuse(f"refusing to start: {exc}", "correct it and start the agent again")
    try:
        asyncio.run(_serve(agent))
    except Exception:
        log.exception("railover-agent stopped on a fatal error")
        sys.exit(1)


if __name__ == "__main__":
    main()
