"""Webhook receivers on loopback, for the tests and benchmarks that send to them.

`post_receiver` answers every POST at once with 200 and hands its body to a callback;
`Trickler` reads the request, then answers one byte every `gap_s` (a receiver too
slow to finish, which the sender's deadline has to cut off).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def post_receiver(on_post: Callable[[bytes], None]) -> Iterator[str]:
    """Yields the receiver's base URL (``http://127.0.0.1:PORT``); each POST's body goes
    to `on_post` (on the server's thread) before the 200 is sent."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            on_post(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


class Trickler:
    """Reads the request, then answers one byte every `gap_s` (a 200 whose header is
    padded by `pad` bytes), for as long as it is let; stops when the sender hangs up.
    Counts the connections it took and the most it held open at once."""

    def __init__(self, gap_s: float = 0.1, pad: int = 10_000) -> None:
        self.gap_s = gap_s
        self.pad = pad
        self.connections = 0
        self.open_now = 0
        self.most_open = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}/hook"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with self._lock:
            self.open_now += 1
            self.most_open = max(self.most_open, self.open_now)
        try:
            self._answer(conn)
        finally:
            with self._lock:
                self.open_now -= 1

    def _answer(self, conn: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + b"X-Pad: " + b"." * self.pad
        with conn:
            conn.recv(65536)
            conn.settimeout(self.gap_s)
            for byte in answer:
                # Wait out the gap, unless the sender hangs up first (its deadline).
                try:
                    if not conn.recv(1) or self._stop.is_set():
                        return
                except TimeoutError:
                    pass
                except OSError:
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def close(self) -> None:
        self._stop.set()
        self._server.close()
