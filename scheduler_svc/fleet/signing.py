"""HMAC-SHA256 signatures on webhook bodies, for senders and receivers alike.

The header is ``Railover-Signature: t=<unix seconds>,v1=<hex digest>`` where the
digest is HMAC-SHA256(secret, "<t>." + body). Signing the timestamp with the
body lets a receiver refuse replays older than its tolerance; the ``v1=``
scheme name leaves room to rotate the algorithm, and several ``v1=`` entries
may appear while a secret is being rotated.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Railover-Signature"
DEFAULT_TOLERANCE_S = 300.0


class SignatureError(ValueError):
    """The signature header is missing, malformed, stale or does not match."""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return mac.hexdigest()


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The header value for `body`, signed now (or at `timestamp`)."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},v1={signature(secret, t, body)}"


def verify(
    secret: str,
    header: str | None,
    body: bytes,
    *,
    now: float | None = None,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> int:
    """Check a header against the raw body; returns its timestamp or raises SignatureError."""
    if not header:
        raise SignatureError(f"{SIGNATURE_HEADER} header missing")
    timestamp: int | None = None
    digests: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            try:
                timestamp = int(value)
            except ValueError as exc:
                raise SignatureError("signature timestamp is not an integer") from exc
        elif key == "v1":
            digests.append(value)
    if timestamp is None or not digests:
        raise SignatureError("signature header needs t= and v1=")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise SignatureError(f"signature timestamp {timestamp} outside the tolerance")
    expected = signature(secret, timestamp, body)
    # compare_digest on every candidate: timing must not reveal which one was close.
    if not any(hmac.compare_digest(expected, d) for d in digests):
        raise SignatureError("signature does not match the body")
    return timestamp
