"""``/healthz`` and ``/metrics`` on METRICS_PORT, served from a small thread.

A thread rather than the event loop so a scrape is answered even when the
loop is stuck, which is exactly when /healthz must say so.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

log = logging.getLogger(__name__)


class HealthServer:
    def __init__(self, host: str, port: int, health: Callable[[], tuple[bool, dict[str, Any]]]):
        check = health

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body = generate_latest(REGISTRY)
                    self._send(200, CONTENT_TYPE_LATEST, body)
                elif path == "/healthz":
                    ok, info = check()
                    info["status"] = "ok" if ok else "unhealthy"
                    self._send(200 if ok else 503, "application/json", json.dumps(info).encode())
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                # Scrapes every 15 s would drown the agent's own log.
                return

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="railover-agent-http", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        log.info("serving /healthz and /metrics on port %d", self.port)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
