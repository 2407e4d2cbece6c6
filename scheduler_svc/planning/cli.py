"""Typer commands for the planning tools (`simulate`, `analytic`, `mirror-plan`)."""

import typer


def register(app: typer.Typer) -> None:
    """Attach the planning commands to the `railover` command line."""
