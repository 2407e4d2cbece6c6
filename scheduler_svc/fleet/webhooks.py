"""Sending one stored event to one webhook URL."""

from __future__ import annotations

import httpx

from scheduler_svc.fleet.events import to_cloudevent
from scheduler_svc.fleet.signing import SIGNATURE_HEADER, sign
from scheduler_svc.store import models as m

USER_AGENT = "railover-webhooks/1"


class DeliveryFailed(Exception):
    """The target did not take the event; retried later."""

    def __init__(self, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.status = status


def post_event(client: httpx.Client, url: str, secret: str, event: m.OutboxEvent) -> int:
    """POST the event in CloudEvents structured mode; returns the 2xx status or raises."""
    headers, body = to_cloudevent(event)
    headers[SIGNATURE_HEADER] = sign(secret, body)
    headers["User-Agent"] = USER_AGENT
    try:
        response = client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}") from exc
    if not response.is_success:
        raise DeliveryFailed(f"HTTP {response.status_code}", response.status_code)
    return response.status_code
