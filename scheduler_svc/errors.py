"""Typed domain errors and the one body every error response has.

main.py renders every failure (these, request validation, JSON syntax errors,
unknown routes and methods, unexpected exceptions) as `ErrorBody`, and every
route lists its failures with that schema, so the document and the wire agree.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

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
