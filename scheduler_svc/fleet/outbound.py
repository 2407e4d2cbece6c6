"""Where webhooks may go, and how long one attempt may take.

Webhook URLs come from API callers. Unchecked, a subscription could make the service post
to its own loopback ports, to a node's link-local neighbours or a cloud metadata address
(169.254.169.254), and read whether each port answered from last_status and last_error.
So every address is checked twice: the literal host at validation (`check_url`, a 422),
and every address the name resolves to at connection time, the connection then made to
the address that was checked (a name that resolves elsewhere later cannot slip past).

httpx's timeout is per read: a receiver that trickles one byte a second never trips it,
and held a delivery slot for over 70 s. `deadline` bounds a whole attempt instead: every
read and write of the connection gets at most what is left of it.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import certifi
import httpcore
import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# A name to the addresses it has now (socket.getaddrinfo's answers; tests pass a stub).
Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """Loopback only where allowed (tests, one-machine demos); private ranges by a setting;
    link-local, unspecified, multicast and reserved addresses never."""

    allow_loopback: bool = False
    allow_private: bool = True

    def refusal(self, address: Address) -> str | None:
        """Why a webhook may not go to `address`; None when it may."""
        mapped = getattr(address, "ipv4_mapped", None)
        if mapped is not None:
            return self.refusal(mapped)
        if address.is_loopback:
            return None if self.allow_loopback else "loopback"
        if address.is_link_local:
            return "link-local"
        if address.is_unspecified:
            return "unspecified"
        if address.is_multicast:
            return "multicast"
        if address.is_private or address.is_reserved:
            # ipaddress counts 0.0.0.0/8, 100.64/10, documentation ranges and the like as
            # private too: all of them are reached only by those allowed private ranges.
            return None if self.allow_private else "private"
        return None


def policy_of(settings: Any) -> AddressPolicy:
    return AddressPolicy(
        allow_loopback=bool(settings.webhook_allow_loopback),
        allow_private=bool(settings.webhook_allow_private),
    )


def check_url(url: str, policy: AddressPolicy) -> None:
    """Refuse, with the reason, a webhook URL whose host is an address (or localhost) the
    policy forbids. A name is checked again at each connection, after resolution."""
    host = urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        if not policy.allow_loopback:
            raise ValueError(f"{redact(url)}: loopback hosts cannot receive webhooks")
        return
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return
    reason = policy.refusal(address)
    if reason is not None:
        raise ValueError(f"{redact(url)}: {reason} addresses cannot receive webhooks")


def redact(url: str) -> str:
    """The URL with any user:password@ replaced, so it can be printed and returned."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparsable URL)"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """The URL without user:password@, and the pair as Basic auth: sent the same, but the
    URL httpx logs at INFO ("HTTP Request: POST ...") then carries no password."""
    parsed = httpx.URL(url)
    if not parsed.userinfo:
        return url, None
    bare = str(parsed.copy_with(username=None, password=None))
    return bare, (parsed.username, parsed.password)


class RefusedAddress(httpcore.ConnectError):
    """The name resolved to an address the policy forbids: nothing was sent."""


# --- the whole-attempt deadline ------------------------------------------------------

_local = threading.local()


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every connection read and write in this thread ends by `seconds` from now."""
    previous = getattr(_local, "until", None)
    _local.until = time.monotonic() + seconds
    try:
        yield
    finally:
        _local.until = previous


def _bounded(timeout: float | None) -> float | None:
    until: float | None = getattr(_local, "until", None)
    if until is None:
        return timeout
    left = until - time.monotonic()
    if left <= 0:
        raise httpcore.ReadTimeout("the attempt's deadline passed")
    return left if timeout is None else min(timeout, left)


class DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, _bounded(timeout))
        return DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class GuardedBackend(httpcore.NetworkBackend):
    """Resolves the name, refuses it if any address is forbidden, connects to a checked one."""

    def __init__(self, policy: AddressPolicy, resolver: Resolver) -> None:
        self._policy = policy
        self._resolver = resolver
        self._tcp = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                addresses = [ipaddress.ip_address(a) for a in self._resolver(host, port)]
            except (OSError, ValueError) as exc:
                raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        if not addresses:
            raise httpcore.ConnectError(f"{host} resolves to no address")
        for address in addresses:
            reason = self._policy.refusal(address)
            if reason is not None:
                raise RefusedAddress(f"{host} resolves to a {reason} address; not sent")
        stream = self._tcp.connect_tcp(
            str(addresses[0]), port, _bounded(timeout), local_address, socket_options
        )
        return DeadlineStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("webhooks do not go to unix sockets")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ProtocolError, httpx.RemoteProtocolError),
    (httpcore.NetworkError, httpx.NetworkError),
)


@contextmanager
def _as_httpx(request: httpx.Request) -> Iterator[None]:
    try:
        yield
    except httpcore.UnsupportedProtocol as exc:
        raise httpx.UnsupportedProtocol(str(exc), request=request) from exc
    except Exception as exc:
        for core, mapped in _ERRORS:
            if isinstance(exc, core):
                raise mapped(str(exc) or type(exc).__name__, request=request) from exc
        raise


class _Body(httpx.SyncByteStream):
    def __init__(self, inner: Iterable[bytes], request: httpx.Request) -> None:
        self._inner = inner
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx(self._request):
            yield from self._inner

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One context for every delivery client of the process: loading the CA bundle takes
    tens of milliseconds, and a context is safe to share between connections."""
    return ssl.create_default_context(cafile=certifi.where())


class GuardedTransport(httpx.BaseTransport):
    """httpx's transport on the guarded backend (the stock one takes no network backend)."""

    def __init__(self, policy: AddressPolicy, resolver: Resolver = system_resolver) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=_tls_context(),
            network_backend=GuardedBackend(policy, resolver),
            max_connections=64,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx(request):
            response = self._pool.handle_request(core)
        assert isinstance(response.stream, Iterable)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_Body(response.stream, request),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._pool.close()


def webhook_client(settings: Any, resolver: Resolver = system_resolver) -> httpx.Client:
    """The client deliveries use: guarded addresses, no redirects (a 3xx to a forbidden
    address would be followed otherwise), no proxies from the environment."""
    return httpx.Client(
        transport=GuardedTransport(policy_of(settings), resolver),
        timeout=settings.webhook_timeout_s,
        follow_redirects=False,
        trust_env=False,
    )
