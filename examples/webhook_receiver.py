"""A minimal fleet-manager endpoint for Railover's signed CloudEvents.

    RAILOVER_WEBHOOK_SECRET=... python examples/webhook_receiver.py 9000

What a receiver must do, in order: verify the signature over the raw body
(reject with 401: forgeries and replays older than five minutes), parse the
CloudEvent, drop duplicates by event id (delivery is at least once), and answer
2xx quickly; anything else is retried with backoff, and a job's later events
wait for this one.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cloudevents.http import from_http

from scheduler_svc.fleet.signing import SIGNATURE_HEADER, SignatureError, verify


class Deduplicator:
    """Remembers the newest `size` event ids."""

    def __init__(self, size: int = 100_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def first_time(self, event_id: str) -> bool:
        if event_id in self._ids:
            return False
        self._ids[event_id] = None
        if len(self._ids) > self._size:
            self._ids.popitem(last=False)
        return True


def handle(
    headers: dict[str, str], body: bytes, secret: str, seen: Deduplicator
) -> tuple[int, dict[str, Any] | None]:
    """(HTTP status, the event if it is new)."""
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        verify(secret, lower.get(SIGNATURE_HEADER.lower()), body)
    except SignatureError:
        return 401, None
    event = from_http(lower, body)
    if not seen.first_time(event["id"]):
        return 200, None
    return 200, {
        "id": event["id"],
        "type": event["type"],
        "job": event.get("partitionkey"),
        "sequence": event.get("sequence"),
        "data": event.get_data(),
    }


def main(port: int) -> None:
    secret = os.environ["RAILOVER_WEBHOOK_SECRET"]
    seen = Deduplicator()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, event = handle(dict(self.headers.items()), body, secret, seen)
            if event is not None:
                data = event["data"] or {}
                print(event["type"], event["job"], data.get("action", ""), data.get("reason", ""))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()  # noqa: S104


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9000)
