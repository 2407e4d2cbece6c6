"""How the service is served: uvicorn with bounded connections, headers and bodies.

uvicorn covers part of it, and is used for that part: `h11_max_incomplete_event_size`
caps the bytes of a request's headers (httptools, uvicorn's default parser where it is
installed, has no cap at all: one 128 MB header took 33.8 s to parse), `limit_concurrency`
answers 503 once too many requests run, `timeout_keep_alive` closes idle kept-alive
connections. It has no timeout for a request's headers or body (a connection that sends
a byte every few seconds is kept forever, until the process runs out of descriptors),
no cap on connections that never finish a request, and none per peer. An ASGI
middleware cannot add those: the app is called only once the headers are complete. So
`GuardedH11Protocol`, uvicorn's h11 protocol with a guard around it, does:

- a header deadline from the connection's first byte (or its last answer) to the end of
  the request's headers: 408 and close;
- a body deadline from the end of the headers to the end of the body (a body sent a byte
  a second, a Content-Length larger than what comes): 408 and close;
- headers over the limit: 431 and close (h11 stops reading at the limit);
- connections over the total or over one peer's share: 503 and close at once, before
  anything is read, so the process never reaches its descriptor limit.

Every refusal is counted (railover_http_refused_total{reason}) and logged at most once
per LOG_EVERY_S as one line with the counts: never a line, let alone a traceback, per
connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional: h11 then
    HttpToolsProtocol = None  # type: ignore[assignment,misc]  # checked before use

from scheduler_svc import metrics
from scheduler_svc.config import Settings, get_settings

log = logging.getLogger("railover.http")
LOG_EVERY_S = 10.0
# Descriptors kept for the store, the listener, log files and outbound calls.
FD_RESERVE = 128


@dataclass(frozen=True, slots=True)
class Limits:
    header_timeout_s: float
    body_timeout_s: float
    max_header_bytes: int
    max_connections: int
    max_connections_per_peer: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            header_timeout_s=settings.http_header_timeout_s,
            body_timeout_s=settings.http_body_timeout_s,
            max_header_bytes=settings.http_max_header_bytes,
            max_connections=settings.http_max_connections,
            max_connections_per_peer=settings.http_max_connections_per_peer,
        )


@dataclass
class Guard:
    """What the connections of one server share: per-peer counts and refusal counts."""

    limits: Limits
    peers: Counter[str] = field(default_factory=Counter)
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)
    logged_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refuse(self, reason: str, peer: str) -> None:
        metrics.HTTP_REFUSED.labels(reason).inc()
        now = time.monotonic()
        with self.lock:
            self.refused[(reason, peer)] += 1
            if now - self.logged_at < LOG_EVERY_S:
                return
            counts, self.refused = self.refused, Counter()
            self.logged_at = now
        by_reason: Counter[str] = Counter()
        for (why, _), n in counts.items():
            by_reason[why] += n
        (_, top_peer), top = max(counts.items(), key=lambda kv: kv[1])
        log.warning(
            "refused %d HTTP requests or connections since the last such line (%s); "
            "most from %s (%d)",
            sum(by_reason.values()),
            ", ".join(f"{why} {n}" for why, n in by_reason.most_common()),
            top_peer,
            top,
        )


ANSWERS = {
    408: ("Request Timeout", "timeout"),
    431: ("Request Header Fields Too Large", "headers_too_large"),
    503: ("Service Unavailable", "unavailable"),
}


def answer(status: int, detail: str) -> bytes:
    """A whole HTTP/1.1 answer in the API's error shape, that closes the connection."""
    phrase, error = ANSWERS[status]
    body = json.dumps({"error": error, "detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    )
    if status == 503:
        head += "retry-after: 1\r\n"
    return head.encode() + b"\r\n" + body


class Guarded:
    """The guard, mixed in before one of uvicorn's HTTP protocols (it relies on their
    `transport`, `client`, `connections`, `cycle`, `loop` and `send_400_response`).

    Built for a server by `protocol_for(settings)`; given to uvicorn by name
    (`uvicorn --http scheduler_svc.serving:GuardedHttpToolsProtocol`, or the H11 one) it
    reads the settings from the environment."""

    guard: Guard | None = None
    # uvicorn's protocol provides these.
    transport: asyncio.Transport
    client: tuple[str, int] | None
    connections: set[Any]
    cycle: Any
    loop: asyncio.AbstractEventLoop

    def _guard_init(self) -> None:
        cls = type(self)
        if cls.guard is None:
            cls.guard = Guard(Limits.of(get_settings()))
        self._guard = cls.guard
        self._peer: str | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_reason = ""
        self._header_bytes = 0

    # What each protocol says of the request being read.
    def _awaiting_headers(self) -> bool:
        raise NotImplementedError

    def _in_body(self) -> bool:
        raise NotImplementedError

    # --- connections ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]  # uvicorn's protocol
        limits = self._guard.limits
        peer = self.client[0] if self.client else "unknown"
        if len(self.connections) > limits.max_connections:
            self._refuse(503, "connections", f"over {limits.max_connections} connections")
            return
        if self._guard.peers[peer] >= limits.max_connections_per_peer:
            detail = f"over {limits.max_connections_per_peer} connections from {peer}"
            self._refuse(503, "connections_per_peer", detail)
            return
        self._peer = peer
        self._guard.peers[peer] += 1
        self._arm(limits.header_timeout_s, "header_timeout")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._peer is not None:
            self._guard.peers[self._peer] -= 1
            if self._guard.peers[self._peer] <= 0:
                del self._guard.peers[self._peer]
            self._peer = None
        super().connection_lost(exc)  # type: ignore[misc]  # uvicorn's protocol

    # --- requests ------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._peer is None:  # refused: nothing is read
            return
        waiting = self._awaiting_headers()
        if waiting:
            self._header_bytes += len(data)
            if self._deadline is None:  # a kept-alive connection's next request
                self._arm(self._guard.limits.header_timeout_s, "header_timeout")
        super().data_received(data)  # type: ignore[misc]  # uvicorn's protocol
        if self.transport.is_closing():
            return
        limits = self._guard.limits
        if self._awaiting_headers():
            # httptools has no limit of its own: over ours, the rest is never parsed.
            if self._header_bytes > limits.max_header_bytes:
                detail = f"request headers over {limits.max_header_bytes} bytes"
                self._refuse(431, "headers_too_large", detail)
            return
        if waiting:
            self._header_bytes = 0
        if self._in_body():
            if self._deadline_reason != "body_timeout":
                self._arm(limits.body_timeout_s, "body_timeout")
        else:
            self._disarm()

    def send_400_response(self, msg: str) -> None:
        # h11 stops buffering headers at h11_max_incomplete_event_size and calls the
        # request invalid; over the limit it is 431, anything else uvicorn's 400.
        if self._header_bytes >= self._guard.limits.max_header_bytes:
            detail = f"request headers over {self._guard.limits.max_header_bytes} bytes"
            self._refuse(431, "headers_too_large", detail)
            return
        self._guard.refuse("invalid", self._peer or "unknown")
        super().send_400_response(msg)  # type: ignore[misc]  # uvicorn's protocol

    def on_response_complete(self) -> None:
        self._header_bytes = 0
        super().on_response_complete()  # type: ignore[misc]  # uvicorn's protocol

    # --- deadlines -----------------------------------------------------------------

    def _arm(self, seconds: float, reason: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, seconds, reason)
        self._deadline_reason = reason

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
            self._deadline_reason = ""

    def _expired(self, seconds: float, reason: str) -> None:
        self._deadline = None
        self._deadline_reason = ""
        if self.transport.is_closing():
            return
        if self.cycle is not None and self.cycle.response_started:
            self._guard.refuse(reason, self._peer or "unknown")
            self.transport.close()
            return
        part = "headers" if reason == "header_timeout" else "body"
        self._refuse(408, reason, f"request {part} not received within {seconds:g} s")

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        self._guard.refuse(reason, self.client[0] if self.client else "unknown")
        self.transport.write(answer(status, detail))
        self.transport.close()


class GuardedH11Protocol(Guarded, H11Protocol):
    """uvicorn's h11 protocol, guarded (where httptools is not installed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard_init()

    def _awaiting_headers(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def _in_body(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY


class GuardedHttpToolsProtocol(Guarded, HttpToolsProtocol):
    """uvicorn's httptools protocol, guarded: what uvicorn picks where httptools is
    installed (issue 12 measured it 17 % cheaper per long-poll renewal than h11)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard_init()
        self._phase = "idle"  # idle | headers | body | done

    def _awaiting_headers(self) -> bool:
        return self._phase in ("idle", "headers")

    def _in_body(self) -> bool:
        return self._phase == "body"

    def on_message_begin(self) -> None:
        self._phase = "headers"
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._phase = "body"
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = "done"
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self._phase == "done":
            self._phase = "idle"
        super().on_response_complete()


def protocol_for(settings: Settings, parser: str = "auto") -> type[asyncio.Protocol]:
    """The protocol class of one server: its own limits and counts; httptools where it is
    installed (as uvicorn's "auto"), else h11."""
    base: type[asyncio.Protocol] = GuardedH11Protocol
    if parser != "h11" and HttpToolsProtocol is not None:
        base = GuardedHttpToolsProtocol
    return type(base.__name__, (base,), {"guard": Guard(Limits.of(settings))})


class QueryTokens(logging.Filter):
    """Blanks token-like query parameters in uvicorn's access log lines: a token sent in
    the query string is refused (401), but was written verbatim to the log."""

    SECRET_KEYS = ("token", "key", "secret", "password", "auth", "signature")

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


class PerConnectionLines(logging.Filter):
    """uvicorn's own line per refused request: "Invalid HTTP request received." (counted
    and logged by the guard instead) is dropped; "Exceeded concurrency limit." (its 503
    for `limit_concurrency`) is counted and let through once per LOG_EVERY_S."""

    def __init__(self) -> None:
        super().__init__()
        self._passed_at = -LOG_EVERY_S

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Invalid HTTP request received"):
            return False
        if message.startswith("Exceeded concurrency limit"):
            metrics.HTTP_REFUSED.labels("concurrency").inc()
            now = time.monotonic()
            if now - self._passed_at < LOG_EVERY_S:
                return False
            self._passed_at = now
        return True


def redact_query(path: str) -> str:
    """`/v1/x?token=abc&limit=2` → `/v1/x?token=***&limit=2`."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    pairs = parse_qsl(query, keep_blank_values=True)
    shown = [
        (k, "***" if any(s in k.lower() for s in QueryTokens.SECRET_KEYS) else v) for k, v in pairs
    ]
    return f"{base}?{urlencode(shown, safe='*/:')}"


def raise_fd_limit(settings: Settings) -> None:
    """Lift the soft descriptor limit towards the hard one, enough for the connection cap
    and the reserve; say so when even the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = settings.http_max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        log.warning(
            "RAILOVER_HTTP_MAX_CONNECTIONS=%d needs %d descriptors and the limit is %d: "
            "lower it, or raise the process's nofile limit",
            settings.http_max_connections,
            need,
            soft,
        )


def _add_once(logger: logging.Logger, kind: type[logging.Filter]) -> None:
    if not any(isinstance(f, kind) for f in logger.filters):
        logger.addFilter(kind())


def server_config(app: Any, settings: Settings, **kwargs: Any) -> uvicorn.Config:
    """uvicorn's configuration for the service, with every limit of the settings."""
    _add_once(logging.getLogger("uvicorn.access"), QueryTokens)
    _add_once(logging.getLogger("uvicorn.error"), PerConnectionLines)
    return uvicorn.Config(
        app,
        http=protocol_for(settings, settings.http_parser),
        h11_max_incomplete_event_size=settings.http_max_header_bytes,
        # Requests in flight (long polls and streams included) beyond the connection cap
        # are answered 503 by uvicorn itself; connections are capped by the guard.
        limit_concurrency=settings.http_max_connections + 1,
        timeout_keep_alive=settings.http_keep_alive_s,
        **kwargs,
    )
