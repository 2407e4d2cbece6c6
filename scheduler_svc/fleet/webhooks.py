"""Sending one stored event to one webhook URL."""

from __future__ import annotations

import httpx

from scheduler_svc.fleet import outbound
from scheduler_svc.fleet.events import to_cloudevent
from scheduler_svc.fleet.signing import SIGNATURE_HEADER, sign
from scheduler_svc.store import models as m

USER_AGENT = "railover-webhooks/1"


class DeliveryFailed(Exception):
    """The target did not take the event; retried later."""

    def __init__(self, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.status = status


def post_event(
    client: httpx.Client, url: str, secret: str, event: m.OutboxEvent, deadline_s: float
) -> int:
    """POST the event in CloudEvents structured mode; returns the 2xx status or raises.

    The whole attempt ends by `deadline_s` (outbound.deadline: httpx's own timeout is per
    read, which a trickling receiver never trips); the answer's body is never read."""
    headers, body = to_cloudevent(event)
    headers[SIGNATURE_HEADER] = sign(secret, body)
    headers["User-Agent"] = USER_AGENT
    bare, auth = outbound.split_credentials(url)
    try:
        with (
            outbound.deadline(deadline_s),
            client.stream("POST", bare, content=body, headers=headers, auth=auth) as response,
        ):
            status = response.status_code
    except httpx.HTTPError as exc:
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}") from exc
    if not 200 <= status < 300:
        raise DeliveryFailed(f"HTTP {status}", status)
    return status
