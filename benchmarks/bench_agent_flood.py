"""Local floods against the agent's fault path (issue 30): how long a real fault waits.

Four figures, each on a real agent (in this process, its own event loop thread) with a
fixture node of shape (a), plugin frames made by native_plugin/wire_codec.py:

- progress: PROGRESS frames of random communicators (default 150,000, over 8
  connections) stream in while the real service (`railover serve`, its own process, a
  SQLite store) is up; once the agent has read them, a port goes down in sysfs.
  Measured: how long the agent took to read the flood, what it left waiting in the
  spool, and port down -> its port_down event in the service's store.
- noise: while the service is away, CQE errors of one NIC (default 120,000) fill the
  spool (100,000 events, the default bound); a port then goes down; the service starts.
  Measured: whether the port_down was kept, and service start -> port_down stored.
- acks: 3,000 ACK frames for commands never handed out, then the real rank's ack of a
  real abort; the service here is the stand-in (railover_testing.agents), which answers
  every ack at once, so the delay is the agent's alone. Measured: the real ack frame ->
  the stand-in has it.
- memory: three floods of 150,000 progress frames of random communicators, each over
  connections that then close; the process's VmRSS before and after.

    .venv/bin/python -m benchmarks.bench_agent_flood [--frames 150000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.benchlib import machine
from native_plugin import wire, wire_codec
from railover_testing.agents import AgentThread, StandInService, settings_for
from railover_testing.local import free_port
from railover_testing.processes import store_rows
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import shape_a, write_rail_map
from railover_testing.waiting import wait_until

IBV_EVENT_PORT_ERR = 10


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def service(port: int, db: Path) -> Iterator[str]:
    """`railover serve` in its own process on `port`; yields its URL once ready."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILOVER_")}
    env["RAILOVER_LOG_LEVEL"] = "WARNING"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scheduler_svc",
            "serve",
            "--port",
            str(port),
            "--db",
            f"sqlite:///{db}",
        ],
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        if not wait_until(ready, timeout=60, step=0.05):
            raise RuntimeError("the service did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def _connect(a: AgentThread, comm_id: int, rank: int, pid: int) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(a.settings.socket))
    s.sendall(wire_codec.encode(wire.Hello(comm_id=comm_id, pid=pid, abi_version=1, rank=rank)))
    return s


def _progress_frames(n: int, pid: int, rng: random.Random) -> bytes:
    now = time.time_ns()
    return b"".join(
        wire_codec.encode(
            wire.Progress(
                comm_id=rng.getrandbits(63) | 1, ops_done=i, timestamp_ns=now, rank=i % 8, pid=pid
            )
        )
        for i in range(n)
    )


def _flood(a: AgentThread, frames: int, connections: int, seed: int) -> float:
    """Send the flood (connections in parallel); seconds until the agent had read it all."""
    rng = random.Random(seed)
    payloads = [_progress_frames(frames // connections, 7000 + i, rng) for i in range(connections)]
    socks = [_connect(a, 0, 0, 7000 + i) for i in range(connections)]
    start = time.monotonic()
    threads = [
        threading.Thread(target=s.sendall, args=(p,)) for s, p in zip(socks, payloads, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in socks:
        s.shutdown(socket.SHUT_WR)
    for s in socks:
        s.settimeout(600)
        s.recv(1)  # the agent closes its end once it has read everything
        s.close()
    return time.monotonic() - start


def _kinds(db: Path) -> list[str]:
    return [str(k) for (k,) in store_rows(f"sqlite:///{db}", "SELECT kind FROM events")]


def progress_flood(work: Path, frames: int) -> dict[str, Any]:
    node = shape_a(work / "sys")
    rails = write_rail_map(work / "rails.json", node.rail_map())
    db = work / "svc.db"
    port = free_port()
    with service(port, db) as url:
        a = AgentThread(settings_for(node.root, work / "agent", url, rails)).start()
        try:
            assert wait_until(lambda: a.agent.registered is not None, timeout=30)
            # The port goes down once the agent has read the whole flood: whatever the
            # flood left waiting for the service is ahead of it.
            read_s = _flood(a, frames, 8, 30)
            a.call(lambda: None)  # a poll tick has had its turn on the loop
            time.sleep(2 * a.settings.poll_interval_s)  # the flood's progress is spooled
            backlog = a.agent.spool.depth()
            down = time.monotonic()
            set_port_state(node.root, "mlx5_0", 1, "DOWN")
            wait_until(lambda: "port_down" in _kinds(db), timeout=900, step=0.01)
            latency = time.monotonic() - down
            return {
                "frames": frames,
                "flood_read_s": round(read_s, 2),
                "backlog_at_port_down": backlog,
                "port_down_to_service_s": round(latency, 3),
            }
        finally:
            a.stop()


def cqe_noise(work: Path, frames: int) -> dict[str, Any]:
    node = shape_a(work / "sys")
    rails = write_rail_map(work / "rails.json", node.rail_map())
    db = work / "svc.db"
    port = free_port()
    a = AgentThread(
        settings_for(node.root, work / "agent", f"http://127.0.0.1:{port}", rails)
    ).start()
    try:
        s = _connect(a, 123, 3, 4242)
        now = time.time_ns()
        start = time.monotonic()
        s.sendall(
            b"".join(
                wire_codec.encode(
                    wire.CqeError(
                        timestamp_ns=now + q, port=1, qp_num=q, wc_status=12, vendor_err=0x81,
                        pid=4242, dev_name="mlx5_2", peer="10.0.0.9",
                    )
                )
                for q in range(frames)
            )
        )  # fmt: skip
        s.shutdown(socket.SHUT_WR)
        s.settimeout(600)
        s.recv(1)
        s.close()
        read_s = time.monotonic() - start
        depth = a.agent.spool.depth()
        set_port_state(node.root, "mlx5_0", 1, "DOWN")
        kept = wait_until(
            lambda: any(
                ev["kind"] == "port_down" for _, ev in a.call(lambda: a.agent.spool.peek(10**6))
            ),
            timeout=20,
        )
        with service(port, db):
            up = time.monotonic()
            arrived = wait_until(lambda: "port_down" in _kinds(db), timeout=120, step=0.01)
            latency = time.monotonic() - up
        return {
            "frames": frames,
            "noise_read_s": round(read_s, 2),
            "spool_depth": depth,
            "port_down_kept": kept,
            "service_up_to_port_down_s": round(latency, 3) if arrived else None,
        }
    finally:
        a.stop()


def ack_flood(work: Path, bogus: int) -> dict[str, Any]:
    node = shape_a(work / "sys")
    rails = write_rail_map(work / "rails.json", node.rail_map())
    standin = StandInService()
    a = AgentThread(settings_for(node.root, work / "agent", standin.url, rails)).start()
    try:
        hub = a.agent.hub
        assert hub is not None
        rank = _connect(a, 123, 3, 4242)
        assert wait_until(lambda: sum(c.hello for c in hub.clients) == 1)
        standin.add_command(
            {"command_id": 77, "job_id": "j1", "kind": "abort", "epoch": 1, "comm_id": 123,
             "ops_done": 0, "disabled_channels": [], "ranks": [3]}
        )  # fmt: skip
        rank.settimeout(10)
        rank.recv(4096)
        assert standin.wait_for(lambda st: any(c == 77 for c, _ in st.acks), timeout=10)
        attacker = _connect(a, 0, 5, 666)
        rng = random.Random(30)
        attacker.sendall(
            b"".join(
                wire_codec.encode(
                    wire.Ack(command_id=rng.randrange(1000, 10**9), status=0, pid=666)
                )
                for _ in range(bogus)
            )
        )
        sent = time.monotonic()
        rank.sendall(wire_codec.encode(wire.Ack(command_id=77, status=0, pid=4242)))
        standin.wait_for(
            lambda st: any(c == 77 and b["status"] == "applied" for c, b in st.acks), timeout=600
        )
        latency = time.monotonic() - sent
        attacker.close()
        rank.close()
        return {
            "bogus_acks": bogus,
            "real_ack_to_service_s": round(latency, 3),
            "ack_requests": standin.state.ack_posts,
        }
    finally:
        a.stop()
        standin.stop()


def memory(work: Path, frames: int, rounds: int = 3) -> dict[str, Any]:
    node = shape_a(work / "sys")
    rails = write_rail_map(work / "rails.json", node.rail_map())
    standin = StandInService()
    a = AgentThread(settings_for(node.root, work / "agent", standin.url, rails)).start()
    try:
        before = _rss_mb()
        for r in range(rounds):
            _flood(a, frames, 8, 100 + r)
        hub = a.agent.hub
        assert hub is not None
        return {
            "frames_per_round": frames,
            "rounds": rounds,
            "rss_before_mb": round(before, 1),
            "rss_after_mb": round(_rss_mb(), 1),
            "hub_last_ops_after": len(hub.last_ops),
        }
    finally:
        a.stop()
        standin.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=150_000, help="progress frames in a flood")
    p.add_argument("--noise", type=int, default=120_000, help="CQE frames of spool noise")
    p.add_argument("--acks", type=int, default=3_000, help="bogus ACK frames")
    p.add_argument(
        "--only", nargs="*", default=["progress", "noise", "acks", "memory"], help="figures"
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    out: dict[str, Any] = {"machine": machine()}
    runs = {
        "progress": lambda w: progress_flood(w, args.frames),
        "noise": lambda w: cqe_noise(w, args.noise),
        "acks": lambda w: ack_flood(w, args.acks),
        "memory": lambda w: memory(w, args.frames),
    }
    for name in args.only:
        with tempfile.TemporaryDirectory(prefix=f"railover-flood-{name}-") as tmp:
            out[name] = runs[name](Path(tmp))
        if not args.json:
            print(f"{name}: {out[name]}", flush=True)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"machine: {out['machine']}")


if __name__ == "__main__":
    main()
