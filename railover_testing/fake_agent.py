"""A stand-in for the agent's plugin listener, for tests and local experiments.

``FakeAgent`` is a plain unix-socket server on a thread that decodes every frame with
``FrameDecoder``, counts them by type, keeps HELLOs and ACKs, and can write raw bytes
(e.g. an encoded ``Command``) back to the connected plugin. Not for production use.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from pathlib import Path

from native_plugin import wire, wire_codec


class FakeAgent:
    """A plain socket server in a thread that decodes and counts every frame it gets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.counts: Counter[type[wire.Message]] = Counter()
        self.hellos: list[wire.Hello] = []
        self.acks: list[wire.Ack | wire.AckAt] = []
        self.errors: list[str] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._conn: socket.socket | None = None
        self._stop = threading.Event()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(4)
        self._server.settimeout(0.05)
        self._thread = threading.Thread(target=self._run, name="fake-agent", daemon=True)
        self._thread.start()

    @property
    def reports(self) -> int:
        with self._lock:
            answers = (wire.Hello, wire.Ack, wire.AckAt)
            return sum(n for t, n in self.counts.items() if t not in answers)

    def send(self, data: bytes) -> None:
        """Write raw bytes to the current connection, waiting briefly for one to exist."""
        deadline = time.monotonic() + 10
        while True:
            with self._lock:
                conn = self._conn
            if conn is not None or time.monotonic() > deadline:
                break
            time.sleep(0.002)
        assert conn is not None, "no plugin connected"
        conn.sendall(data)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            with self._lock:
                self._conn = conn
                self.connections += 1
            self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        decoder = wire_codec.FrameDecoder()
        conn.settimeout(0.05)
        with conn:
            while not self._stop.is_set():
                try:
                    data = conn.recv(1 << 16)
                except TimeoutError:
                    continue
                if not data:
                    break
                try:
                    msgs = decoder.feed(data)
                except wire.WireError as exc:
                    self.errors.append(str(exc))
                    break
                with self._lock:
                    for m in msgs:
                        self.counts[type(m)] += 1
                        if isinstance(m, wire.Hello):
                            self.hellos.append(m)
                        elif isinstance(m, (wire.Ack, wire.AckAt)):
                            self.acks.append(m)
        with self._lock:
            self._conn = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()
        self.path.unlink(missing_ok=True)
