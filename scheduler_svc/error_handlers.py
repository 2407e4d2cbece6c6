"""One renderer for every failure, and the OpenAPI entries that document it.

Domain errors, request validation, JSON syntax errors (by line and column),
unknown routes, wrong methods, oversized bodies, an unreachable store and
unexpected exceptions all answer `errors.ErrorBody`; `document_errors` lists
those answers on every operation, so a client generated from the document
parses what it really gets.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException
from starlette.routing import Match

from scheduler_svc.errors import ErrorBody, FieldProblem, RailoverError
from scheduler_svc.schemas import EventKind

log = logging.getLogger("railover")

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
}


def _render(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _line_col(doc: str | bytes, pos: int) -> tuple[int, int]:
    text = doc.decode("utf-8", "replace") if isinstance(doc, bytes) else doc
    pos = max(0, min(pos, len(text)))
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return line, col


def _validation_body(exc: RequestValidationError) -> ErrorBody:
    problems: list[FieldProblem] = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        if err.get("type") == "json_invalid":
            pos = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else 0
            line, col = _line_col(exc.body or "", pos)
            reason = (err.get("ctx") or {}).get("error", "invalid JSON")
            problems.append(
                FieldProblem(
                    field="body", problem=f"JSON syntax: {reason} at line {line} column {col}"
                )
            )
            continue
        # The body's own name and pydantic's union-member tags say nothing to a caller.
        parts = [str(p) for p in loc if p != "body" and not _is_union_tag(p)]
        field = ".".join(parts) or "body"
        problems.append(FieldProblem(field=field, problem=str(err.get("msg", "invalid"))))
    first = problems[0] if problems else FieldProblem(field="body", problem="invalid")
    summary = f"{first.field}: {first.problem}"
    if len(problems) > 1:
        summary += f" (and {len(problems) - 1} more)"
    return ErrorBody(error="invalid", detail=summary, fields=problems)


def _is_union_tag(part: object) -> bool:
    # Discriminated-union members appear in locations as their tag, e.g. "port_down".
    return isinstance(part, str) and part in _UNION_TAGS


_UNION_TAGS = {k.value for k in EventKind}


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette's 405 names only the first)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            m2, _ = route.matches({**request.scope, "method": method})
            if m2 == Match.FULL:
                methods.add(method)
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RailoverError)
    async def _domain(_: Request, exc: RailoverError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return _render(exc.status_code, exc.body(), headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _render(422, _validation_body(exc))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        status = exc.status_code
        if status == 404:
            detail = f"no route {request.url.path}; the API is under /v1 (see /openapi.json)"
        elif status == 405:
            allowed = _allowed_methods(request)
            headers["Allow"] = ", ".join(allowed)
            detail = (
                f"{request.method} is not served at {request.url.path}; use {', '.join(allowed)}"
            )
        else:
            detail = str(exc.detail)
        code = _STATUS_CODES.get(status, "error" if status < 500 else "internal_error")
        return _render(status, ErrorBody(error=code, detail=detail), headers or None)

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _store_down(_: Request, exc: Exception) -> JSONResponse:
        log.warning("store unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
        body = ErrorBody(error="unavailable", detail="the store is unavailable; retry shortly")
        return _render(503, body, {"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected failure in %s %s", request.method, request.url.path)
        body = ErrorBody(error="internal_error", detail="unexpected failure; see the service log")
        return _render(500, body)


_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
_METHODS = ("get", "put", "post", "delete", "patch")


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ERROR_REF}}}


def _add_errors(doc: dict[str, Any]) -> dict[str, Any]:
    """List on each operation the errors it can answer, every one as ErrorBody."""
    for path, item in doc.get("paths", {}).items():
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            answers: dict[str, Any] = op.setdefault("responses", {})
            # FastAPI's own 422 (HTTPValidationError) is not what this service sends.
            for entry in answers.values():
                schema = entry.get("content", {}).get("application/json", {}).get("schema", {})
                if schema.get("$ref", "").endswith("/HTTPValidationError"):
                    entry["content"]["application/json"]["schema"] = _ERROR_REF
            has_params = bool(op.get("parameters")) or "requestBody" in op
            extra = {"500": _error("Unexpected failure")}
            if has_params or path.startswith("/v1"):
                extra["422"] = _error("A field is missing or invalid")
            if "requestBody" in op:
                extra["413"] = _error("The request body is too large")
            if path.startswith("/v1"):
                extra["401"] = _error("No valid bearer token")
                extra["403"] = _error("The token's role or node does not allow this")
                extra["503"] = _error("The store is unavailable; retry")
            if "{" in path:
                extra["404"] = _error("The resource does not exist")
            for status, entry in extra.items():
                answers.setdefault(status, entry)
    schemas = doc.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return doc


def document_errors(app: FastAPI) -> None:
    """Make the OpenAPI document list every error answer with the one error body."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _add_errors(plain())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def limit_body(
    max_bytes: int,
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    """Middleware refusing bodies over max_bytes with 413, declared or streamed."""

    async def middleware(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > max_bytes:
                return _too_large(max_bytes)
        elif "chunked" in request.headers.get("transfer-encoding", "").lower() and (
            # No length given: read it here (it is replayed to the route) and count.
            len(await request.body()) > max_bytes
        ):
            return _too_large(max_bytes)
        return await call_next(request)

    return middleware


def _too_large(max_bytes: int) -> JSONResponse:
    body = ErrorBody(
        error="too_large",
        detail=f"body: larger than {max_bytes} bytes; split the request",
        fields=[FieldProblem(field="body", problem=f"larger than {max_bytes} bytes")],
    )
    return _render(413, body)
