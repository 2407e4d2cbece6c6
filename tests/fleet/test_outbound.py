"""Where webhooks may go and how long an attempt lasts (fleet/outbound.py), on loopback
only: names resolve through stubs, and forbidden addresses are refused before any
connection."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from scheduler_svc.config import Settings
from scheduler_svc.fleet.outbound import (
    AddressPolicy,
    GuardedTransport,
    check_url,
    deadline,
    policy_of,
    redact,
    split_credentials,
    system_resolver,
    webhook_client,
)

CLOSED = AddressPolicy()
OPEN = AddressPolicy(allow_loopback=True, allow_private=True)
PUBLIC_ONLY = AddressPolicy(allow_private=False)


@pytest.mark.parametrize(
    ("address", "policy", "refusal"),
    [
        ("127.0.0.1", CLOSED, "loopback"),
        ("127.9.9.9", CLOSED, "loopback"),
        ("::1", CLOSED, "loopback"),
        ("::ffff:127.0.0.1", CLOSED, "loopback"),
        ("127.0.0.1", OPEN, None),
        ("169.254.169.254", OPEN, "link-local"),
        ("fe80::1", OPEN, "link-local"),
        ("0.0.0.0", OPEN, "unspecified"),
        ("::", OPEN, "unspecified"),
        ("224.0.0.1", OPEN, "multicast"),
        ("ff02::1", OPEN, "multicast"),
        ("10.1.2.3", CLOSED, None),
        ("10.1.2.3", PUBLIC_ONLY, "private"),
        ("192.168.1.1", PUBLIC_ONLY, "private"),
        ("fc00::1", PUBLIC_ONLY, "private"),
        ("240.0.0.1", PUBLIC_ONLY, "private"),
        ("8.8.8.8", PUBLIC_ONLY, None),
        ("2001:4860::8888", PUBLIC_ONLY, None),
    ],
)
def test_address_policy(address: str, policy: AddressPolicy, refusal: str | None) -> None:
    assert policy.refusal(ipaddress.ip_address(address)) == refusal


def test_the_default_policy_refuses_loopback_and_allows_private_ranges() -> None:
    assert AddressPolicy() == AddressPolicy(allow_loopback=False, allow_private=True)


@pytest.mark.parametrize(
    ("url", "policy", "refusal"),
    [
        ("http://localhost:8080/h", CLOSED, "http://localhost:8080/h: loopback hosts"),
        ("http://api.localhost/h", CLOSED, "http://api.localhost/h: loopback hosts"),
        ("http://localhost/h", OPEN, None),
        ("http://u:p@127.0.0.1/h", CLOSED, "http://***@127.0.0.1/h: loopback addresses"),
        ("http://[::1]:9/h", CLOSED, "http://[::1]:9/h: loopback addresses"),
        ("http://10.0.0.1/h", PUBLIC_ONLY, "http://10.0.0.1/h: private addresses"),
        ("http://hooks.example/h", PUBLIC_ONLY, None),
        ("http://8.8.8.8/h", PUBLIC_ONLY, None),
    ],
)
def test_check_url(url: str, policy: AddressPolicy, refusal: str | None) -> None:
    if refusal is None:
        check_url(url, policy)
        return
    with pytest.raises(ValueError, match="cannot receive webhooks") as info:
        check_url(url, policy)
    assert str(info.value).startswith(refusal)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:secret@hooks.example:8443/p?q=1", "http://***@hooks.example:8443/p?q=1"),
        ("https://token@hooks.example/p", "https://***@hooks.example/p"),
        ("http://a@b:c@hooks.example/", "http://***@hooks.example/"),
        ("http://hooks.example/p", "http://hooks.example/p"),
    ],
)
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_split_credentials() -> None:
    assert split_credentials("http://hooks.example/p") == ("http://hooks.example/p", None)
    assert split_credentials("http://u:s%40cret@hooks.example:81/p?x=1") == (
        "http://hooks.example:81/p?x=1",
        ("u", "s@cret"),
    )


@pytest.fixture
def trickler() -> Iterator[tuple[int, list[int]]]:
    """A loopback server answering a byte every 50 ms; yields its port and bytes sent."""
    server = socket.create_server(("127.0.0.1", 0))
    sent: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Pad: " + b"." * 5000:
                if stop.wait(0.05):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                sent.append(byte)

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], sent
    stop.set()
    server.close()


def test_a_deadline_ends_an_attempt_whose_every_read_is_prompt(
    trickler: tuple[int, list[int]],
) -> None:
    port, sent = trickler
    with (
        httpx.Client(transport=GuardedTransport(OPEN), timeout=5) as client,
        pytest.raises(httpx.TimeoutException),
        deadline(0.5),
    ):
        client.post(f"http://127.0.0.1:{port}/h", content=b"{}")
    # Cut off long before the answer's 5,000 bytes: each read came within the 5 s timeout.
    assert 0 < len(sent) < 200


def test_a_deadline_left_behind_bounds_nothing_after_it() -> None:
    """Leaving a deadline restores the one before (none here): the next attempt fails as
    itself (nothing listens), not as the passed deadline's timeout."""
    with deadline(0.001):
        pass
    with (
        httpx.Client(transport=GuardedTransport(OPEN), timeout=0.5) as client,
        pytest.raises(httpx.ConnectError),
    ):
        client.post("http://127.0.0.1:9/h", content=b"{}")  # nothing listens on port 9


def test_a_name_resolving_to_a_forbidden_address_is_refused_before_connecting() -> None:
    asked: list[tuple[str, int]] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return {"a.example": ["8.8.8.8", "127.0.0.1"], "none.example": []}[host]

    with httpx.Client(transport=GuardedTransport(CLOSED, resolver), timeout=1) as client:
        with pytest.raises(httpx.ConnectError, match="resolves to a loopback address; not sent"):
            client.post("http://a.example:8080/h", content=b"{}")
        with pytest.raises(httpx.ConnectError, match="resolves to no address"):
            client.post("http://none.example/h", content=b"{}")
        with pytest.raises(httpx.ConnectError, match="link-local address; not sent"):
            client.post("http://169.254.169.254/latest", content=b"{}")
    assert asked == [("a.example", 8080), ("none.example", 80)]


@contextmanager
def receiver(
    host: str, status: int = 200, headers: dict[str, str] | None = None
) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """A loopback HTTP receiver on `host` only; yields its port and the headers it got."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_name_is_connected_to_at_the_address_it_was_checked_as() -> None:
    """The receiver listens on 127.0.0.2 alone: only the address the stub resolver gave
    reaches it (the name itself would resolve nowhere)."""
    with (
        receiver("127.0.0.2") as (port, seen),
        httpx.Client(
            transport=GuardedTransport(
                OPEN, lambda host, _: {"hooks.example": ["127.0.0.2"]}[host]
            ),
            timeout=5,
        ) as client,
    ):
        r = client.post(f"http://hooks.example:{port}/h", content=b"{}")
    assert (r.status_code, r.content) == (200, b"ok")
    assert seen[0]["host"] == f"hooks.example:{port}"


def test_the_delivery_client_follows_the_settings_and_no_redirect() -> None:
    db_url = "sqlite:///never-opened.db"  # settings only: no store is opened
    settings = Settings(
        db_url=db_url, webhook_allow_loopback=True, webhook_allow_private=False, webhook_timeout_s=7
    )
    assert policy_of(settings) == AddressPolicy(allow_loopback=True, allow_private=False)
    assert policy_of(Settings(db_url=db_url)) == AddressPolicy()
    with (
        receiver("127.0.0.1", 302, {"Location": "http://169.254.169.254/"}) as (port, seen),
        webhook_client(settings) as client,
    ):
        assert (client.timeout.read, client.follow_redirects, client.trust_env) == (7, False, False)
        r = client.post(f"http://127.0.0.1:{port}/h", content=b"{}")
    assert r.status_code == 302 and len(seen) == 1  # the redirect is not followed
    with webhook_client(Settings(db_url=db_url)) as closed, pytest.raises(httpx.ConnectError):
        closed.post(f"http://127.0.0.1:{port}/h", content=b"{}")


def test_the_tighter_of_the_deadline_and_the_read_timeout_ends_a_silent_receiver() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    try:
        port = server.getsockname()[1]
        started = time.monotonic()
        with (
            httpx.Client(transport=GuardedTransport(OPEN), timeout=0.3) as client,
            pytest.raises(httpx.TimeoutException),
            deadline(60.0),
        ):
            client.post(f"http://127.0.0.1:{port}/h", content=b"{}")
        assert time.monotonic() - started < 30  # the read timeout, not the deadline
    finally:
        server.close()


def test_the_system_resolver_and_urls_with_no_usable_host() -> None:
    found = system_resolver("localhost", 80)
    assert found and len(found) == len(set(found))
    assert all(ipaddress.ip_address(a).is_loopback for a in found)
    assert redact("http://[::1") == "(unparsable URL)"
    check_url("http:///no-host", CLOSED)  # nothing to check until it resolves
