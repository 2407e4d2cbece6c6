"""Typed domain errors; one handler in main.py renders them as {"error", "detail"}."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel


class ErrorBody(BaseModel):
    """Every error response: a short machine-readable code and a sentence for people."""

    error: str
    detail: Any


class RailoverError(Exception):
    status_code: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"

    def __init__(self, detail: Any) -> None:
        super().__init__(detail)
        self.detail = detail


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


def responses(*errors: type[RailoverError]) -> dict[int | str, dict[str, Any]]:
    """The `responses=` entry of a route, so the OpenAPI document lists its failures."""
    return {e.status_code: {"model": ErrorBody, "description": e.__doc__ or e.code} for e in errors}


VALIDATION: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorBody, "description": "A field is missing or invalid"}
}
