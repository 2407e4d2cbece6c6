"""The failure a command explains in two lines instead of a traceback."""

from __future__ import annotations


class CliError(Exception):
    """A failure the user can fix: what went wrong, then what to do about it."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem} ({fix})")
        self.problem = problem
        self.fix = fix
