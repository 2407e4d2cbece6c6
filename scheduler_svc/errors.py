"""Failures as people are told them: typed domain errors, the one body every error
response has, and the two lines (problem, fix) a command ends with instead of a traceback.

main.py renders every failure (these, request validation, JSON syntax errors,
unknown routes and methods, unexpected exceptions) as `ErrorBody`, and every
route lists its failures with that schema, so the document and the wire agree.
The command line's expected failures (`refuse`, `explain`) print their problem and
its fix on stderr, for `railover` and its planning commands alike.
"""

from __future__ import annotations

import re
import sys
import traceback
from typing import Any, ClassVar, NoReturn

import typer
from pydantic import BaseModel, Field


class FieldProblem(BaseModel):
    field: str = Field(description="Dotted path of the field in the request, e.g. events.0.device")
    problem: str


class ErrorBody(BaseModel):
    """Every error response: a machine-readable code, a sentence for people, the fields at fault."""

    error: str = Field(description="Stable code: invalid, not_found, unauthorized, ...")
    detail: str = Field(description="One line saying what is wrong and, where it helps, the fix")
    fields: list[FieldProblem] = Field(
        default_factory=list, description="Each field at fault; empty when no field is"
    )


# "ranks[7].gpu: node 'n0' has no GPU 9" names its field before the colon.
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.\[\]]*): (.+)$", re.DOTALL)


def field_problems(messages: list[str]) -> list[FieldProblem]:
    """The field-naming messages of a domain error, split into field and problem."""
    out = []
    for msg in messages:
        match = _FIELD_PREFIX.match(msg)
        if match:
            # One spelling for paths: ranks[7].gpu is ranks.7.gpu, as in validation errors.
            field = re.sub(r"\[(\d+)\]", r".\1", match[1])
            out.append(FieldProblem(field=field, problem=match[2]))
    return out


class RailoverError(Exception):
    status_code: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"

    def __init__(self, detail: str | list[str]) -> None:
        super().__init__(detail)
        self.detail = detail

    def body(self) -> ErrorBody:
        messages = [self.detail] if isinstance(self.detail, str) else list(self.detail)
        summary = messages[0] if messages else self.code
        if len(messages) > 1:
            summary += f" (and {len(messages) - 1} more)"
        return ErrorBody(error=self.code, detail=summary, fields=field_problems(messages))


class Unauthorized(RailoverError):
    """No valid bearer token."""

    status_code = 401
    code = "unauthorized"


class Forbidden(RailoverError):
    """The token's role or node does not allow this."""

    status_code = 403
    code = "forbidden"


class NotFound(RailoverError):
    """The node, job or command does not exist."""

    status_code = 404
    code = "not_found"


class Conflict(RailoverError):
    """The resource already exists or changed meanwhile."""

    status_code = 409
    code = "conflict"


class Unprocessable(RailoverError):
    """A field is missing or invalid."""

    status_code = 422
    code = "invalid"


class TooLarge(RailoverError):
    """The request body is larger than the service accepts."""

    status_code = 413
    code = "too_large"


def responses(*errors: type[RailoverError]) -> dict[int | str, dict[str, Any]]:
    """The `responses=` entry of a route, so the OpenAPI document lists its failures."""
    return {e.status_code: {"model": ErrorBody, "description": e.__doc__ or e.code} for e in errors}


VALIDATION: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorBody, "description": "A field is missing or invalid"}
}


# --- the command line's failures ---------------------------------------------

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
