"""Where webhooks may go and how long an attempt lasts (fleet/outbound.py), on loopback
only: names resolve through stubs, and forbidden addresses are refused before any
connection."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from scheduler_svc.fleet.outbound import (
    AddressPolicy,
    GuardedTransport,
    check_url,
    deadline,
    redact,
    split_credentials,
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
