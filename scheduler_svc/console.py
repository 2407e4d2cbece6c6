"""Failures a command explains in two lines, the problem and its fix, instead of a traceback."""

from __future__ import annotations

import sys
import traceback
from typing import NoReturn

import typer

# Set by `railover --debug`: failures explained in two lines show their traceback too.
debug = False


def refuse(problem: str, fix: str, program: str = "railover") -> NoReturn:
    """Print the problem and its fix on stderr and exit 2 (with the traceback under --debug).

    Raises `typer.Exit`, so it ends the command the same way from the console script
    and from a test's `CliRunner`.
    """
    explain(problem, fix, program)
    raise typer.Exit(2)


def explain(problem: str, fix: str, program: str = "railover") -> None:
    """The two lines; under --debug, the exception being handled (or the stack) first."""
    if debug:
        if sys.exc_info()[1] is not None:
            traceback.print_exc()
        else:
            traceback.print_stack()
    typer.echo(f"{program}: {problem}", err=True)
    typer.echo(f"  fix: {fix}", err=True)
