"""Railover-Signature against the documented format, not against sign() itself.

The receiver's side of the contract (README, fleet/signing.py docstring):
``Railover-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>``,
refused when t is more than the tolerance away from now, in either direction.
"""

from __future__ import annotations

import hashlib
import hmac
import time

import pytest

from scheduler_svc.fleet.signing import (
    DEFAULT_TOLERANCE_S,
    SIGNATURE_HEADER,
    SignatureError,
    sign,
    signature,
    verify,
)

SECRET = "whsec_known_answer"
T = 1767225600  # 2026-01-01T00:00:00Z
BODY = b'{"id":"e1","type":"io.railover.decision.created"}'
# Computed once by hand with Python's hmac (and checked below the same way): a fixed vector,
# so a change to the signed string or the algorithm cannot pass by changing both sides.
DIGEST = "32cdf837bbbe6d2de3ee14d6588bc75dba335633ef7221be725f3c6285f90f26"
HEADER = f"t={T},v1={DIGEST}"


def independent_digest(secret: str, timestamp: int, body: bytes) -> str:
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def test_known_answer_vector() -> None:
    assert independent_digest(SECRET, T, BODY) == DIGEST
    assert SIGNATURE_HEADER == "Railover-Signature"
    assert signature(SECRET, T, BODY) == DIGEST
    assert sign(SECRET, BODY, timestamp=T) == HEADER
    assert verify(SECRET, HEADER, BODY, now=T) == T


def test_sign_without_timestamp_signs_now() -> None:
    before = int(time.time())
    header = sign(SECRET, BODY)
    after = int(time.time())
    t = int(header.split(",")[0].removeprefix("t="))
    assert before <= t <= after
    assert header == f"t={t},v1={independent_digest(SECRET, t, BODY)}"
    # verify() defaults to the clock too.
    assert verify(SECRET, header, BODY) == t


def test_body_only_hmac_is_refused() -> None:
    """The timestamp must be signed, or an old body could be replayed with a fresh t."""
    body_only = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    with pytest.raises(SignatureError, match=r"^signature does not match the body$"):
        verify(SECRET, f"t={T},v1={body_only}", BODY, now=T)


def test_replayed_signature_with_a_new_timestamp_is_refused() -> None:
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRET, f"t={T + 60},v1={DIGEST}", BODY, now=T + 60)


@pytest.mark.parametrize(
    ("now", "ok"),
    [
        (T, True),
        (T + DEFAULT_TOLERANCE_S, True),  # exactly at the tolerance: still accepted
        (T - DEFAULT_TOLERANCE_S, True),
        (T + DEFAULT_TOLERANCE_S + 0.5, False),  # stale
        (T - DEFAULT_TOLERANCE_S - 0.5, False),  # from the future: a skewed or forged sender
        (T - 3600, False),
    ],
)
def test_timestamp_tolerance_both_ways(now: float, ok: bool) -> None:
    if ok:
        assert verify(SECRET, HEADER, BODY, now=now) == T
    else:
        with pytest.raises(
            SignatureError, match=rf"^signature timestamp {T} outside the tolerance$"
        ):
            verify(SECRET, HEADER, BODY, now=now)


def test_default_tolerance_is_five_minutes() -> None:
    assert DEFAULT_TOLERANCE_S == 300.0
    verify(SECRET, HEADER, BODY, now=T + 300)
    with pytest.raises(SignatureError, match="outside the tolerance"):
        verify(SECRET, HEADER, BODY, now=T + 301)


def test_custom_tolerance() -> None:
    assert verify(SECRET, HEADER, BODY, now=T + 10, tolerance_s=10) == T
    with pytest.raises(SignatureError, match="outside the tolerance"):
        verify(SECRET, HEADER, BODY, now=T + 11, tolerance_s=10)


@pytest.mark.parametrize(
    ("secret", "body"),
    [("whsec_other", BODY), (SECRET, BODY + b" "), (SECRET, b"")],
)
def test_other_secret_or_body_is_refused(secret: str, body: bytes) -> None:
    with pytest.raises(SignatureError, match=r"^signature does not match the body$"):
        verify(secret, HEADER, body, now=T)


def test_any_of_several_v1_entries_matches_during_rotation() -> None:
    old = independent_digest("whsec_old", T, BODY)
    header = f"t={T}, v1={old} , v1={DIGEST}"
    assert verify(SECRET, header, BODY, now=T) == T
    assert verify("whsec_old", header, BODY, now=T) == T
    with pytest.raises(SignatureError, match="does not match"):
        verify("whsec_third", header, BODY, now=T)


def test_unknown_schemes_are_ignored() -> None:
    v0 = hashlib.sha256(BODY).hexdigest()
    assert verify(SECRET, f"v0={v0},t={T},v1={DIGEST}", BODY, now=T) == T
    with pytest.raises(SignatureError, match=r"^signature header needs t= and v1=$"):
        verify(SECRET, f"t={T},v2={DIGEST}", BODY, now=T)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, r"^Railover-Signature header missing$"),
        ("", r"^Railover-Signature header missing$"),
        (f"v1={DIGEST}", r"^signature header needs t= and v1=$"),
        (f"t={T}", r"^signature header needs t= and v1=$"),
        (f"t={T}v1={DIGEST}", r"^signature timestamp is not an integer$"),
        (f"t=soon,v1={DIGEST}", r"^signature timestamp is not an integer$"),
        (f"t {T},v1 {DIGEST}", r"^signature header needs t= and v1=$"),
    ],
)
def test_malformed_headers_say_why(header: str | None, message: str) -> None:
    with pytest.raises(SignatureError, match=message) as info:
        verify(SECRET, header, BODY, now=T)
    if "integer" in message:
        assert isinstance(info.value.__cause__, ValueError)


def test_signature_error_is_a_value_error() -> None:
    assert issubclass(SignatureError, ValueError)
