"""The agent's link to the central service: timeouts on every call, retries with backoff.

A call either returns the service's answer, raises ``Rejected`` (the service
understood and refused: retrying the same request cannot help), or raises
``Unavailable`` (no answer, 5xx, 429, auth trouble: try again later). Callers
loop on; nothing here ends the agent.

``ServerFault`` is the ``Unavailable`` of a 500 (or another 5xx that is not a
gateway or outage answer): the service took the request and broke on it. That
may pass, or may be one event the service cannot digest; the reporting loop
retries it a bounded number of rounds, then bisects the batch to find it
(agent/runner.py). 502, 503 and 504 say the service or its store is away, and
are retried for as long as that lasts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
from httpx_sse import SSEError, aconnect_sse
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from agent import metrics
from agent.config import AgentSettings

log = logging.getLogger(__name__)


class ServiceError(Exception):
    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class Unavailable(ServiceError):
    """Try again later."""


class Rejected(ServiceError):
    """The service refused this request as it stands."""


class ServerFault(Unavailable):
    """The service failed on this request (HTTP 500 and kin): maybe the request itself."""


# Rounds of retries (each one a backed-off call of `attempts` tries) that a batch
# answered with a server fault gets before it is bisected to find the event at fault.
SERVER_FAULT_ROUNDS = 3
# Statuses that say the service, a gateway or the store is away, not that it broke.
_OUTAGE = frozenset({502, 503, 504})
KEEPALIVE_S = 2.0


class _Retryable(Exception):
    def __init__(self, err: Unavailable) -> None:
        super().__init__(str(err))
        self.err = err


# Statuses that mean "not now" rather than "never".
_TRANSIENT = frozenset({408, 425, 429, 500, 502, 503, 504})


def _answered(endpoint: str, resp: httpx.Response) -> int:
    """The service answered: count it by outcome; its status."""
    metrics.SERVICE_UP.set(1)
    code = resp.status_code
    metrics.SERVICE_REQUESTS.labels(endpoint, "ok" if code < 300 else f"http_{code}").inc()
    return code


def _refusal(endpoint: str, code: int, body: str) -> ServiceError:
    """What an answer of 300 or more means to the agent (the module's docstring)."""
    if code >= 500 and code not in _OUTAGE:
        return ServerFault(f"{endpoint}: HTTP {code}: {body}", code, body)
    if code in _TRANSIENT:
        return Unavailable(f"{endpoint}: HTTP {code}: {body}", code, body)
    if code in (401, 403):
        # A bad token will not fix itself within one call; the loop's
        # longer backoff retries it, and the log says why.
        return Unavailable(f"{endpoint}: HTTP {code} (check RAILOVER_AGENT_TOKEN): {body}", code)
    return Rejected(f"{endpoint}: HTTP {code}: {body}", code, body)


class Backoff:
    """Exponential backoff between loop iterations, reset on success."""

    def __init__(self, initial: float, cap: float) -> None:
        self.initial = initial
        self.cap = cap
        self.current = initial

    def next(self) -> float:
        delay = self.current
        self.current = min(self.cap, self.current * 2)
        return delay

    def reset(self) -> None:
        self.current = self.initial


class ServiceClient:
    def __init__(
        self,
        settings: AgentSettings,
        transport: httpx.AsyncBaseTransport | None = None,
        attempts: int = 3,
    ) -> None:
        self.settings = settings
        self.node = settings.node_name
        self.attempts = attempts
        self._http = httpx.AsyncClient(
            base_url=settings.service_url,
            headers={**settings.bearer(), "User-Agent": "railover-agent"},
            timeout=httpx.Timeout(settings.request_timeout_s),
            # Drop an idle connection before the service's keep-alive (uvicorn: 5 s) closes
            # it, so a request never races the server's close and meets a reset.
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _once(
        self,
        endpoint: str,
        method: str,
        url: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        start = time.perf_counter()
        try:
            resp = await self._http.request(
                method,
                url,
                json=json,
                params=params,
                timeout=httpx.Timeout(timeout) if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.HTTPError as exc:
            metrics.SERVICE_REQUESTS.labels(endpoint, "error").inc()
            metrics.SERVICE_UP.set(0)
            raise _Retryable(Unavailable(f"{endpoint}: {type(exc).__name__}: {exc}")) from exc
        finally:
            metrics.SERVICE_REQUEST_DURATION.labels(endpoint).observe(time.perf_counter() - start)
        code = _answered(endpoint, resp)
        if code < 300:
            return resp
        err = _refusal(endpoint, code, resp.text[:2000])
        if isinstance(err, ServerFault) or (isinstance(err, Unavailable) and code in _TRANSIENT):
            raise _Retryable(err)
        raise err

    async def _call(
        self,
        endpoint: str,
        method: str,
        url: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=0.05, max=min(2.0, self.settings.retry_max_backoff_s))
            + wait_random(0, 0.05),
            retry=retry_if_exception_type(_Retryable),
            reraise=False,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._once(
                        endpoint, method, url, json=json, params=params, timeout=timeout
                    )
        except RetryError as exc:
            last = exc.last_attempt.exception()
            if isinstance(last, _Retryable):
                raise last.err from None
            raise Unavailable(f"{endpoint}: {last}") from last
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def register(self, payload: dict[str, Any]) -> dict[str, Any]:
        resp = await self._call("register", "PUT", f"/v1/nodes/{self.node}", json=payload)
        metrics.REGISTRATIONS.inc()
        data: dict[str, Any] = resp.json() if resp.content else {}
        return data

    async def post_events(self, events: list[dict[str, Any]]) -> tuple[int, int]:
        resp = await self._call("events", "POST", "/v1/events", json={"events": events})
        data = resp.json()
        return int(data.get("accepted", 0)), int(data.get("duplicates", 0))

    async def fetch_commands(
        self, wait_s: float, include_unacked: bool = False
    ) -> list[dict[str, Any]]:
        # The long poll legitimately takes wait_s; the timeout allows for that.
        params: dict[str, Any] = {"wait_s": wait_s}
        if include_unacked:
            params["include_unacked"] = "true"
        resp = await self._call(
            "commands",
            "GET",
            f"/v1/nodes/{self.node}/commands",
            params=params,
            timeout=wait_s + self.settings.request_timeout_s,
        )
        commands: list[dict[str, Any]] = resp.json().get("commands", [])
        return commands

    async def stream_commands(
        self, heartbeat_s: float, include_unacked: bool = True
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """This node's command stream, as (event, data) until it ends or breaks.

        One attempt, no retries (the command loop reconnects with its backoff). A stream
        silent for longer than heartbeat_s plus request_timeout_s is taken as lost.
        Raises what `_call` raises: Rejected (a service without the stream answers 404),
        Unavailable otherwise.
        """
        params = {"heartbeat_s": heartbeat_s, "include_unacked": str(include_unacked).lower()}
        timeout = httpx.Timeout(
            self.settings.request_timeout_s, read=heartbeat_s + self.settings.request_timeout_s
        )
        url = f"/v1/nodes/{self.node}/commands/stream"
        try:
            async with aconnect_sse(
                self._http, "GET", url, params=params, timeout=timeout
            ) as source:
                resp = source.response
                code = _answered("commands_stream", resp)
                if code >= 300:
                    await resp.aread()
                    raise _refusal("commands_stream", code, resp.text[:2000])
                async for sse in source.aiter_sse():
                    yield sse.event, sse.json()
        except (httpx.HTTPError, SSEError, ValueError) as exc:
            # ValueError: an event's data that is not JSON (a proxy's page, a cut line).
            metrics.SERVICE_REQUESTS.labels("commands_stream", "error").inc()
            if not isinstance(exc, ValueError):
                metrics.SERVICE_UP.set(0)
            raise Unavailable(f"commands_stream: {type(exc).__name__}: {exc}") from exc

    async def ack(
        self,
        command_id: int,
        status: str,
        ranks: Sequence[int] | None,
        detail: str,
        ops_done: int | None = None,
    ) -> None:
        """Acknowledge a command for some of this node's ranks, or (ranks None) for the node."""
        body: dict[str, Any] = {"node": self.node, "status": status, "detail": detail[:2000]}
        if ranks is not None and len(ranks) == 1:
            body["rank"] = ranks[0]
        elif ranks is not None:
            body["ranks"] = list(ranks)
        if ops_done is not None:
            body["ops_done"] = ops_done
        await self._call("ack", "POST", f"/v1/commands/{command_id}/acks", json=body)
        metrics.ACKS_SENT.labels(status).inc(len(ranks) if ranks else 1)
