"""Typer commands for the planning tools (`simulate`, `analytic`, `mirror-plan`).

Each command lives in its own module (``cli_simulate``, ``cli_analytic``,
``cli_mirror_plan``); the options they share, and the way every one of them
takes parameters from flags, a YAML file or the defaults, are ``cli_options``.
"""

from __future__ import annotations

import typer

from scheduler_svc.planning import analytic as analytic_model
from scheduler_svc.planning import mirror
from scheduler_svc.planning.cli_analytic import analytic_command
from scheduler_svc.planning.cli_mirror_plan import mirror_plan_command
from scheduler_svc.planning.cli_simulate import SIMULATE_HELP, simulate_command


def register(app: typer.Typer) -> None:
    """Attach the planning commands to the `railover` command line."""
    app.command("simulate", help=SIMULATE_HELP)(simulate_command)
    app.command("analytic", help=analytic_model.__doc__)(analytic_command)
    app.command("mirror-plan", help=mirror.__doc__)(mirror_plan_command)
