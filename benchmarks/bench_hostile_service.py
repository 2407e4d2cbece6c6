"""Issue 30's attacks on the service at full size, and normal requests' latency beside them.

The service runs as its own process (`railover serve --dev`, SQLite, its default limits;
webhooks to loopback allowed for the receivers here). A normal client (its own source
address, 127.0.0.9) sends GET /v1/jobs one after another; its p50 and p99 are taken with
no attack, then while each attack is in play:

- slowloris: 2,000 connections (500 from each of four source addresses, under the
  per-peer cap) that send a request line and part of a header, then a byte every 2 s;
  what each gets back, and when;
- huge headers: one sender (then four), each a process of its own, sending a 64 MB
  header again and again;
- streams: 2,000 command streams of one node, opened one after another;
- a trickling webhook receiver (a byte a second) beside a healthy one: 100 events to
  each; how long the healthy one takes to get all of them, with and without the trickler.

    .venv/bin/python -m benchmarks.bench_hostile_service [--requests 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from datetime import UTC, datetime
from typing import Any

import httpx

from benchmarks import benchlib
from railover_testing.cluster_shapes import hgx_node
from railover_testing.webhook_receivers import Trickler, post_receiver
from scheduler_svc.fleet.events import emit
from scheduler_svc.fleet.repositories import SubscriptionRepo
from scheduler_svc.store.db import make_engine, make_sessionmaker

NORMAL_SOURCE = "127.0.0.9"
SLOW_SOURCES = ("127.0.1.1", "127.0.1.2", "127.0.1.3", "127.0.1.4")
SECRET = "s" * 32


def lift_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def latencies(url: str, n: int) -> dict[str, float]:
    """n GET /v1/jobs from the normal client: p50, p99 and max in ms, and failures."""
    took, failed = [], 0
    transport = httpx.HTTPTransport(local_address=NORMAL_SOURCE)
    with httpx.Client(base_url=url, timeout=60, transport=transport) as http:
        for _ in range(n):
            started = time.perf_counter()
            try:
                ok = http.get("/v1/jobs").status_code == 200
            except httpx.HTTPError:
                ok = False
            took.append(time.perf_counter() - started)
            failed += not ok
    ms = [t * 1000 for t in took]
    return {
        "p50_ms": round(benchlib.percentile(ms, 50), 2),
        "p99_ms": round(benchlib.percentile(ms, 99), 2),
        "max_ms": round(max(ms), 2),
        "failed": failed,
    }


def connect(url: str, source: str) -> socket.socket:
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    sock.settimeout(60)
    return sock


def slowloris(url: str, n: int, requests: int) -> dict[str, Any]:
    stop = threading.Event()
    with ExitStack() as stack:
        socks = []
        for i in range(n):
            sock = stack.enter_context(connect(url, SLOW_SOURCES[i % len(SLOW_SOURCES)]))
            sock.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(sock)
        opened = time.monotonic()

        def trickle() -> None:
            while not stop.wait(2.0):
                for sock in socks:
                    with suppress(OSError):
                        sock.send(b"a")

        threading.Thread(target=trickle, daemon=True).start()
        during = latencies(url, requests)
        answers: dict[str, int] = {}
        ended = []
        for sock in socks:
            got = read_all(sock)
            answers[got[:12].decode(errors="replace") or "(closed)"] = (
                answers.get(got[:12].decode(errors="replace") or "(closed)", 0) + 1
            )
            ended.append(time.monotonic() - opened)
        stop.set()
    return {"connections": n, "during": during, "answers": answers, "all_ended_s": max(ended)}


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def send_huge_headers(url: str, size: int, stop: Any, results: Any) -> None:
    """One sender (a process of its own: the normal client's latency must not include
    waiting for the GIL behind the senders): a `size` header, again and again."""
    chunk = b"a" * 65536
    while not stop.is_set():
        with connect(url, "127.0.1.9") as sock:
            started = time.monotonic()
            sent = 0
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
            with suppress(OSError):
                while sent < size:
                    sock.sendall(chunk)
                    sent += len(chunk)
            got = read_all(sock)
            results.put((got[:12].decode(errors="replace"), sent, time.monotonic() - started))


def huge_header(url: str, senders: int, size: int, requests: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=send_huge_headers, args=(url, size, stop, results), daemon=True)
        for _ in range(senders)
    ]
    for proc in procs:
        proc.start()
    # The senders under way (a spawned process takes seconds to import on a loaded machine).
    got: list[tuple[str, int, float]] = [results.get(timeout=120) for _ in range(senders)]
    during = latencies(url, requests)
    stop.set()
    while any(p.is_alive() for p in procs) or not results.empty():
        with suppress(queue.Empty):
            got.append(results.get(timeout=0.5))
    for proc in procs:
        proc.join(60)
    statuses: dict[str, int] = {}
    for status, _, _ in got:
        statuses[status or "(reset)"] = statuses.get(status or "(reset)", 0) + 1
    return {
        "senders": senders,
        "header_mb": size // 2**20,
        "during": during,
        "attempts": len(got),
        "answers": statuses,
        "most_sent_before_refused_kb": max(s for _, s, _ in got) // 1024 if got else 0,
        "slowest_refusal_s": round(max(t for _, _, t in got), 3) if got else 0,
    }


def streams(url: str, n: int, requests: int) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=60) as http:
        http.put("/v1/nodes/n0", json=hgx()).raise_for_status()
    started = time.monotonic()
    with ExitStack() as stack:
        socks = []
        for i in range(n):
            sock = stack.enter_context(connect(url, SLOW_SOURCES[i % len(SLOW_SOURCES)]))
            sock.sendall(b"GET /v1/nodes/n0/commands/stream HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(sock)
        opened_s = time.monotonic() - started
        during = latencies(url, requests)
        metrics = httpx.get(f"{url}/metrics", timeout=60).text
    open_now = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("railover_command_streams ")
    )
    return {"streams": n, "opened_s": round(opened_s, 2), "during": during, "open": open_now}


def hgx() -> dict[str, Any]:
    node: dict[str, Any] = hgx_node()
    return node


@contextmanager
def healthy_receiver() -> Iterator[tuple[str, list[float]]]:
    got: list[float] = []
    with post_receiver(lambda _body: got.append(time.monotonic())) as url:
        yield f"{url}/hook", got


def webhooks(url: str, db_url: str, events: int, requests: int, trickler: bool) -> dict[str, Any]:
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    slow = Trickler(gap_s=1.0, pad=1000) if trickler else None
    try:
        with healthy_receiver() as (hook, got), sessions() as s, s.begin():
            repo = SubscriptionRepo(s)
            now = datetime.now(UTC)
            prefix = "t" if trickler else "h"
            for target in [hook] + ([slow.url] if slow else []):
                repo.create(
                    url=target, event_types=[], job_id=f"{prefix}-only", description="",
                    secret=SECRET, created_by=None, now=now,
                )  # fmt: skip
            s.commit()
            started = time.monotonic()
            with sessions() as w, w.begin():
                for i in range(events):
                    emit(w, "io.railover.switch.fault", job_id=f"{prefix}-only",
                         subject=f"switch/s{i}", data={"i": i})  # fmt: skip
            during = latencies(url, requests)
            deadline = time.monotonic() + 300
            while len(got) < events and time.monotonic() < deadline:
                time.sleep(0.05)
            all_s = (max(got) - started) if len(got) >= events else float("nan")
        return {"trickler": trickler, "events": events, "healthy_all_s": round(all_s, 2),
                "during": during}  # fmt: skip
    finally:
        if slow is not None:
            slow.close()
        engine.dispose()


def run(requests: int, only: set[str]) -> dict[str, Any]:
    lift_fd_limit()
    out: dict[str, Any] = {"machine": benchlib.machine()}
    env = {"RAILOVER_WEBHOOK_ALLOW_LOOPBACK": "true", "RAILOVER_DELIVERY_POLL_S": "0.2"}
    scenarios: dict[str, Callable[[str, str], dict[str, Any]]] = {
        "baseline": lambda url, _: latencies(url, requests),
        "slowloris": lambda url, _: slowloris(url, 2000, requests),
        "huge_header": lambda url, _: huge_header(url, 1, 64 * 2**20, requests),
        "huge_headers_x4": lambda url, _: huge_header(url, 4, 64 * 2**20, requests),
        "streams": lambda url, _: streams(url, 2000, requests),
        "webhooks_healthy_only": lambda url, db: webhooks(url, db, 100, requests, False),
        "webhooks_with_trickler": lambda url, db: webhooks(url, db, 100, requests, True),
    }
    for name, scenario in scenarios.items():
        if only and name not in only:
            continue
        with (
            benchlib.scratch_store("sqlite") as db_url,
            benchlib.served_process(db_url, env=env) as (url, _),
        ):
            out[name] = scenario(url, db_url)
            print(name, json.dumps(out[name]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="normal requests per phase")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    only = {s for s in args.only.split(",") if s}
    result = run(args.requests, only)
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
