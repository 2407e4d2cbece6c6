"""One renderer for every failure, and the OpenAPI entries that document it.

Domain errors, request validation, JSON syntax errors (by line and column),
unknown routes, wrong methods, oversized bodies, an unreachable store and
unexpected exceptions all answer `errors.ErrorBody`; `document_errors` lists
those answers on every operation, so a client generated from the document
parses what it really gets.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler_svc.api.schemas.events import EventKind
from scheduler_svc.errors import ErrorBody, FieldProblem, RailoverError

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
        if any(p.field == field for p in problems):
            continue  # one problem per field: the other union members failed too
        problems.append(FieldProblem(field=field, problem=str(err.get("msg", "invalid"))))
    first = problems[0] if problems else FieldProblem(field="body", problem="invalid")
    summary = f"{first.field}: {first.problem}"
    if len(problems) > 1:
        summary += f" (and {len(problems) - 1} more)"
    return ErrorBody(error="invalid", detail=summary, fields=problems)


# Pydantic names the member of a union it tried in an error's location: a tag such as
# "constrained-str", "literal['']", "int" or an event kind. None of them is a field.
_TYPE_TAGS = {"int", "float", "str", "bool", "none", "list", "dict"}
_UNION_TAGS = {k.value for k in EventKind}


def _is_union_tag(part: object) -> bool:
    if not isinstance(part, str):
        return False
    return part in _UNION_TAGS or part in _TYPE_TAGS or any(c in part for c in "-[]'(")


def _allowed_methods(request: Request) -> list[str]:
    """Every method the document lists at this path (Starlette's 405 names only one route's)."""
    table: list[tuple[re.Pattern[str], set[str]]] | None = getattr(
        request.app.state, "_allow", None
    )
    if table is None:
        table = []
        for path, item in request.app.openapi().get("paths", {}).items():
            regex, _, _ = compile_path(path)
            table.append((regex, {m.upper() for m in item if m in _METHODS}))
        request.app.state._allow = table
    methods: set[str] = set()
    for regex, found in table:
        if regex.match(request.url.path):
            methods |= found
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RailoverError)
    async def _domain(_: Request, exc: RailoverError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return _render(exc.status_code, exc.body(), headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        body = _validation_body(exc)
        sent = request.headers.get("content-type", "")
        if "json" not in sent and any(p.field == "body" for p in body.fields):
            # A body that was not read as JSON at all, e.g. curl -d without a header.
            as_sent = sent or "no Content-Type"
            hint = f"sent as {as_sent}; send JSON with Content-Type: application/json"
            body = ErrorBody(
                error="invalid",
                detail=f"body: {hint}",
                fields=[FieldProblem(field="body", problem=hint)],
            )
        return _render(422, body)

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

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, exc: ClientDisconnect) -> Response:
        # The client went, or the server's body deadline closed it (serving.py): no one
        # reads an answer, and a traceback per such connection would flood the log.
        return Response(status_code=400)

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
                extra["400"] = _error("The body is not JSON (or not UTF-8)")
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


# Which answers lead to which operations (OpenAPI links), for clients and for stateful
# testing: (from operation, status) -> {link name: (to operation, {parameter: expression})}.
_LINKS: dict[tuple[str, str], dict[str, tuple[str, dict[str, str]]]] = {
    ("create_job", "201"): {
        name: (op, {"job_id": "$response.body#/job_id"})
        for name, op in (
            ("GetJob", "get_job"),
            ("ListDecisions", "list_decisions"),
            ("GetPaths", "get_paths"),
            ("ListJobCommands", "list_job_commands"),
            ("ReportCheckpoint", "report_checkpoint"),
            ("ReportIterations", "report_iterations"),
            ("DeleteJob", "delete_job"),
        )
    },
    ("register_node", "200"): {
        "GetNode": ("get_node", {"node": "$response.body#/name"}),
        "PollCommands": ("poll_commands", {"node": "$response.body#/name"}),
    },
    ("list_job_commands", "200"): {
        "AckCommand": ("ack_command", {"command_id": "$response.body#/commands/0/command_id"}),
    },
    ("poll_commands", "200"): {
        "AckCommand": ("ack_command", {"command_id": "$response.body#/commands/0/command_id"}),
    },
    ("create_subscription", "201"): {
        name: (op, {"subscription_id": "$response.body#/subscription_id"})
        for name, op in (("GetSubscription", "get_subscription"), ("Delete", "delete_subscription"))
    },
    ("list_deliveries", "200"): {
        "Replay": ("replay_delivery", {"delivery_id": "$response.body#/deliveries/0/delivery_id"}),
    },
}


def _add_links(doc: dict[str, Any]) -> None:
    for item in doc.get("paths", {}).values():
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            for (source, status), links in _LINKS.items():
                if op.get("operationId") == source and status in op.get("responses", {}):
                    op["responses"][status]["links"] = {
                        name: {"operationId": target, "parameters": params}
                        for name, (target, params) in links.items()
                    }


def document_errors(app: FastAPI) -> None:
    """Make the OpenAPI document list every error answer with the one error body."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = _add_errors(plain())
            _add_links(doc)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


class LimitBody:
    """ASGI middleware refusing bodies over max_bytes with 413, declared or streamed.

    A declared Content-Length over the limit is refused before any of the body is
    read. A chunked body with no length is read here to its end and counted; one
    within the limit is handed on to the route as one message, as it arrived.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared: str | None = None
        encoding: str | None = None
        for key, value in scope["headers"]:  # names arrive lower-case (ASGI)
            if key == b"content-length" and declared is None:
                declared = value.decode("latin-1")
            elif key == b"transfer-encoding" and encoding is None:
                encoding = value.decode("latin-1")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                await _too_large(self.max_bytes)(scope, receive, send)
                return
        elif encoding is not None and "chunked" in encoding.lower():
            body, size, last = await _read_counted(receive, self.max_bytes)
            if size > self.max_bytes:
                await _too_large(self.max_bytes)(scope, receive, send)
                return
            await self.app(scope, _replay(body, last, receive), send)
            return
        await self.app(scope, receive, send)


async def _read_counted(receive: Receive, max_bytes: int) -> tuple[bytes, int, Message | None]:
    """The body read to its end (kept only while within max_bytes), its size, and the
    message that cut it short (a disconnect), if one did."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(parts), size, message
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size <= max_bytes:
            parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts), size, None


def _replay(body: bytes, last: Message | None, receive: Receive) -> Receive:
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": last is not None}]
    if last is not None:
        pending.append(last)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def _too_large(max_bytes: int) -> JSONResponse:
    body = ErrorBody(
        error="too_large",
        detail=f"body: larger than {max_bytes} bytes; split the request",
        fields=[FieldProblem(field="body", problem=f"larger than {max_bytes} bytes")],
    )
    return _render(413, body)
