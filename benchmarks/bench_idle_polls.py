"""Idle fleets: N agents long-polling their commands while nothing happens, then one fault.

The service runs as its own process (`railover serve`, as in production). The
agents are N keep-alive HTTP/1.1 connections from one asyncio process, written on
raw sockets (asyncio streams) so that the load generator stays cheap next to the
service on a 2-core machine; each asks `GET /v1/nodes/<node>/commands?wait_s=W`
again as soon as the previous poll returns, as the agent does (W: the agent's
default, 20 s). Measured:

- idle: the service process's CPU share (user + system, from /proc) over a window
  in which nothing is issued, as a share of one core; and that of the pollers;
- delivery: one RNIC fault at a time in a 2-node job, posted while every poll
  waits; the delay from the commit of its failover command to the return of the
  faulty node's waiting poll. The commit lies between the POST's send and its answer,
  so both bounds are printed: from the answer (a lower bound) and from the send
  (an upper bound, which includes the decision itself).

Runs: `old` is the path before issue 12 (each waiting poll re-reads the store every
second: `RECHECK_S = 1.0` set in the service process), `new` the wake-up path; on
SQLite with one replica, and across two PostgreSQL replicas (polls held on B,
faults posted to A, B's CPU measured). `stream-sqlite` and `stream-postgres` are the
same with each agent holding the command stream instead (`GET
/v1/nodes/<node>/commands/stream?heartbeat_s=H`, the agent's default since it exists):
one open response per agent, a keepalive line every H seconds, read off the chunked
answer on the same raw sockets. Their "polls/s" column counts keepalives, and the
CPU of opening the 8,192 streams is printed too (what the streams' reconnects cost,
one every RAILOVER_COMMANDS_STREAM_MAX_S per agent).

    .venv/bin/python -m benchmarks.bench_idle_polls [--agents 8192] [--old-agents 1000]
        [--idle-s 40] [--samples 64] [--heartbeat-s 30]
        [--runs old,sqlite,postgres,stream-sqlite,stream-postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from benchmarks import benchlib
from railover_testing.cluster_shapes import hgx_node

WAIT_S = 20.0  # the agent's default command_wait_s; --wait-s changes it
HEARTBEAT_S = 30.0  # the agent's default command_heartbeat_s; --heartbeat-s changes it
TICKS = os.sysconf("SC_CLK_TCK")
# Started in the service process in place of `python -m scheduler_svc`: the old path.
OLD_PATH = (
    "import sys; import scheduler_svc.api.commands as c; c.RECHECK_S = 1.0; "
    "from scheduler_svc.cli import main; sys.argv[0] = 'railover'; main()"
)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@contextmanager
def service(db_url: str, *, old_path: bool = False) -> Iterator[tuple[str, int]]:
    """`railover serve` in its own process; yields its URL and pid."""
    head = ("-c", OLD_PATH) if old_path else ("-m", "scheduler_svc")
    # Nobody acknowledges: no re-issue of a delivered command may wake a poll meanwhile.
    # The service's cap on a poll's wait is raised to W, so a poll waits the W it asks for
    # (its default, 30 s, would end longer polls early); the service's stop ends them.
    env = {
        "RAILOVER_LOG_LEVEL": "ERROR",
        "RAILOVER_COMMAND_ACK_TIMEOUT_S": "3600",
        "RAILOVER_COMMANDS_WAIT_MAX_S": str(max(30.0, WAIT_S)),
    }
    with benchlib.served_process(db_url, head=head, env=env) as served:
        yield served


class Pollers:
    """N long-polling agents on raw keep-alive connections, in this process's event loop."""

    def __init__(self, port: int, nodes: list[str]) -> None:
        self.port = port
        self.nodes = nodes
        self.connected = 0
        self.polls = 0
        self.errors = 0
        # node -> perf_counter() of each return that carried commands
        self.deliveries: dict[str, list[float]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = False

    async def start(self) -> None:
        gate = asyncio.Semaphore(128)  # connect in waves: the listen backlog is finite
        self._tasks = [asyncio.create_task(self._agent(n, gate)) for n in self.nodes]
        while self.connected + self.errors < len(self.nodes):
            await asyncio.sleep(0.1)
        if self.errors:
            raise RuntimeError(f"{self.errors} of {len(self.nodes)} pollers failed to connect")

    async def stop(self) -> None:
        self._stop = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _send(
        self, path: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes] | None:
        """A connection with `GET path` sent on it; None (an error counted) if none opened."""
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            self.errors += 1
            return None
        request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode()
        writer.write(request)
        return reader, writer, request

    async def _agent(self, node: str, gate: asyncio.Semaphore) -> None:
        async with gate:
            sent = await self._send(f"/v1/nodes/{node}/commands?wait_s={WAIT_S}")
            if sent is None:
                return
            reader, writer, request = sent
            self.connected += 1
        try:
            while not self._stop:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length)
                now = time.perf_counter()
                self.polls += 1
                writer.write(request)  # the next poll goes out at once, as the agent's does
                if json.loads(body).get("commands"):
                    self.deliveries.setdefault(node, []).append(now)
        except (OSError, asyncio.IncompleteReadError):
            self.errors += 1
        finally:
            writer.close()


class Streamers(Pollers):
    """N agents each holding the command stream open, on raw keep-alive connections."""

    async def _agent(self, node: str, gate: asyncio.Semaphore) -> None:
        async with gate:
            sent = await self._send(
                f"/v1/nodes/{node}/commands/stream?heartbeat_s={HEARTBEAT_S}&include_unacked=false"
            )
            if sent is None:
                return
            reader, writer, _ = sent
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (OSError, asyncio.IncompleteReadError):
                self.errors += 1
                return
            if not head.startswith(b"HTTP/1.1 200") or b"chunked" not in head.lower():
                self.errors += 1
                return
            self.connected += 1
        pending = b""
        try:
            while not self._stop:
                # One chunk of the chunked answer: its size in hex, CRLF, the bytes, CRLF.
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    raise asyncio.IncompleteReadError(b"", None)  # the stream ended
                pending += await reader.readexactly(size)
                await reader.readexactly(2)
                now = time.perf_counter()
                while b"\n\n" in pending:
                    event, pending = pending.split(b"\n\n", 1)
                    if event.startswith(b"event: command"):
                        self.deliveries.setdefault(node, []).append(now)
                    elif event.startswith(b"event: ready") or event.startswith(b": keepalive"):
                        self.polls += 1  # the first poll's counterpart, then each keepalive
                    elif event.startswith(b"event: end"):
                        raise asyncio.IncompleteReadError(b"", None)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            if not self._stop:
                self.errors += 1
        finally:
            writer.close()


def setup_jobs(url: str, samples: int) -> list[tuple[str, list[str]]]:
    """`samples` 2-node jobs; returns (job_id, nodes)."""
    jobs = []
    checkpoint = datetime.now(UTC) - timedelta(seconds=2400)
    with httpx.Client(base_url=url, timeout=60) as http:
        for j in range(samples):
            members = [f"m{j:03d}a", f"m{j:03d}b"]
            for n in members:
                body = hgx_node(switch_name=f"j{j}-rail{{rail}}")
                http.put(f"/v1/nodes/{n}", json=body).raise_for_status()
            body = benchlib.job_body(f"job{j:03d}", members, checkpoint)
            http.post("/v1/jobs", json=body).raise_for_status()
            jobs.append((f"job{j:03d}", members))
    return jobs


async def idle_cpu(pid: int, seconds: float) -> tuple[float, float]:
    """CPU share of one core, of the service and of this process, over `seconds`."""
    me = os.getpid()
    s0, c0, t0 = cpu_seconds(pid), cpu_seconds(me), time.perf_counter()
    await asyncio.sleep(seconds)
    s1, c1, t1 = cpu_seconds(pid), cpu_seconds(me), time.perf_counter()
    return (s1 - s0) / (t1 - t0), (c1 - c0) / (t1 - t0)


async def deliveries(
    post_url: str, pollers: Pollers, jobs: list[tuple[str, list[str]]]
) -> tuple[list[float], list[float]]:
    """One fault per job, one at a time, on the job's first node, which its failover
    command goes to: per fault, the delay (from the answer, from the send)."""
    low: list[float] = []
    high: list[float] = []
    # Generous: a fault posted while a burst of renewals queues waits behind it.
    async with httpx.AsyncClient(base_url=post_url, timeout=300) as http:
        for _job, (node, _) in jobs:
            seen = len(pollers.deliveries.get(node, []))
            body = {
                "events": [
                    {
                        "event_id": str(uuid.uuid4()),
                        "node": node,
                        "kind": "port_down",
                        "device": "mlx5_6",
                        "port": 1,
                        "observed_at": datetime.now(UTC).isoformat(),
                    }
                ]
            }
            sent = time.perf_counter()
            r = await http.post("/v1/events", json=body)
            answered = time.perf_counter()
            r.raise_for_status()
            deadline = time.perf_counter() + 300
            while len(pollers.deliveries.get(node, [])) <= seen:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"no command reached {node} within 300 s")
                await asyncio.sleep(0.005)
            got = pollers.deliveries[node][seen]
            low.append(got - answered)
            high.append(got - sent)
            await asyncio.sleep(0.1)  # one fault at a time, not a storm
    return low, high


def pct(values: list[float], q: float) -> float:
    return benchlib.percentile(values, q) * 1000


async def measure(
    poll_url: str,
    post_url: str,
    pid: int,
    *,
    agents: int,
    samples: int,
    idle_s: float,
    stream: bool = False,
) -> dict[str, Any]:
    jobs = setup_jobs(post_url, samples)
    nodes = [n for _, members in jobs for n in members]
    nodes += [f"idle{i:05d}" for i in range(max(0, agents - len(nodes)))]
    pollers = (Streamers if stream else Pollers)(int(poll_url.rsplit(":", 1)[1]), nodes)
    opening = cpu_seconds(pid)
    await pollers.start()
    # Measure in the steady state: every agent's first poll has returned (its first look,
    # which queues on 2 cores, is long over) and its second one waits.
    settle = time.perf_counter() + 3 * max(WAIT_S, HEARTBEAT_S) + len(nodes) / 50
    while pollers.polls < len(nodes):
        if time.perf_counter() > settle:
            raise RuntimeError(f"only {pollers.polls} of {len(nodes)} first polls returned")
        await asyncio.sleep(0.1)
    opened = cpu_seconds(pid) - opening  # every first look (or stream opened)
    # The agents renew together, every WAIT_S (streams: a keepalive every HEARTBEAT_S):
    # start half-way between two, so that a window of k periods holds k of them whole.
    await asyncio.sleep((HEARTBEAT_S if stream else WAIT_S) / 2)
    polls0 = pollers.polls
    svc, client = await idle_cpu(pid, idle_s)
    renewals = (pollers.polls - polls0) / idle_s
    low, high = await deliveries(post_url, pollers, jobs)
    await pollers.stop()
    if pollers.errors:
        raise RuntimeError(f"{pollers.errors} pollers lost their connection")
    return {
        "agents": len(nodes),
        "svc_cpu": svc,
        "client_cpu": client,
        "polls_per_s": renewals,
        "open_cpu_s": opened,
        "low": low,
        "high": high,
    }


def row(label: str, res: dict[str, Any]) -> str:
    low, high = res["low"], res["high"]
    delays = (
        f"{pct(low, 50):>7.1f} {pct(low, 99):>7.1f} {pct(high, 50):>7.1f} {pct(high, 99):>7.1f}"
        if low
        else " " * 31
    )
    return (
        f"{label:24} {res['agents']:>6} {res['svc_cpu'] * 100:>7.1f}% "
        f"{res['client_cpu'] * 100:>7.1f}% {res['polls_per_s']:>7.0f} "
        f"{delays} {len(low):>5} {os.getloadavg()[0]:>5.1f}"
    )


def main() -> None:
    global WAIT_S, HEARTBEAT_S  # noqa: PLW0603 (one setting for the whole run, read by the pollers)
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--agents", type=int, default=8192)
    ap.add_argument("--old-agents", type=int, default=1000, help="agents on old and new paths")
    ap.add_argument("--idle-s", type=float, help="idle CPU window (default: 2 x wait-s)")
    ap.add_argument("--wait-s", type=float, default=WAIT_S, help="each poll's wait_s")
    ap.add_argument("--heartbeat-s", type=float, default=HEARTBEAT_S, help="each stream's")
    ap.add_argument("--samples", type=int, default=100, help="faults, each to a 2-node job")
    ap.add_argument("--runs", default="old,sqlite,postgres,stream-sqlite,stream-postgres")
    args = ap.parse_args()
    WAIT_S = args.wait_s
    HEARTBEAT_S = args.heartbeat_s
    runs = args.runs.split(",")
    m = benchlib.machine()
    print(
        f"machine: {m['nproc']} cores, {m['cpu']}; agents: raw asyncio keep-alive sockets in "
        f"one process, wait_s={WAIT_S:g}, heartbeat_s={HEARTBEAT_S:g}; idle window "
        f"{args.idle_s or 2 * WAIT_S:g} s ({args.idle_s or 2 * HEARTBEAT_S:g} s for streams); "
        f"{args.samples} faults, each to a 2-node job"
    )
    print(
        f"{'run':24} {'agents':>6} {'svc cpu':>8} {'pollers':>8} {'polls/s':>7} "
        f"{'ans p50':>7} {'ans p99':>7} {'snd p50':>7} {'snd p99':>7} {'n':>5} {'load':>5}"
    )
    print(
        " " * 58 + "(delivery delay in ms, from the POST's answer / its send; "
        "load: the machine's 1-min load average, other users included)"
    )

    def idle_s(stream: bool) -> float:
        return float(args.idle_s or 2 * (HEARTBEAT_S if stream else WAIT_S))

    def show(label: str, res: dict[str, Any], stream: bool) -> None:
        print(row(label, res), flush=True)
        if stream:
            print(
                f"{'':24} opening {res['agents']} streams took {res['open_cpu_s']:.1f} s of "
                f"service CPU ({res['open_cpu_s'] / res['agents'] * 1000:.2f} ms each)",
                flush=True,
            )

    def run(
        label: str, backend: str, agents: int, *, old: bool = False, stream: bool = False
    ) -> dict[str, Any]:
        # The old path keeps the service busy, and each fault's request waits for it.
        samples = min(args.samples, 10) if old else args.samples
        with benchlib.scratch_store(backend) as db, service(db, old_path=old) as (url, pid):
            res = asyncio.run(
                measure(
                    url,
                    url,
                    pid,
                    agents=agents,
                    samples=samples,
                    idle_s=idle_s(stream),
                    stream=stream,
                )
            )
        show(label, res, stream)
        return res

    def replicas(label: str, stream: bool) -> None:
        with benchlib.scratch_store("postgres") as db, ExitStack() as stack:
            a, _ = stack.enter_context(service(db))
            b, pid_b = stack.enter_context(service(db))
            res = asyncio.run(
                measure(
                    b,
                    a,
                    pid_b,
                    agents=args.agents,
                    samples=args.samples,
                    idle_s=idle_s(stream),
                    stream=stream,
                )
            )
        show(label, res, stream)

    if "old" in runs:
        with benchlib.scratch_store("sqlite") as db, service(db) as (_, pid):
            svc, client = asyncio.run(idle_cpu(pid, idle_s(False)))
        empty = {"agents": 0, "svc_cpu": svc, "client_cpu": client, "polls_per_s": 0.0}
        print(row("sqlite, no agents", empty | {"low": [], "high": []}), flush=True)
        before = run("sqlite, old: 1 s re-read", "sqlite", args.old_agents, old=True)
        after = run("sqlite, new", "sqlite", args.old_agents)
        ratio = before["svc_cpu"] / max(after["svc_cpu"], 1e-9)
        print(f"idle service CPU at {args.old_agents} agents: old / new = {ratio:.1f}x")
    if "sqlite" in runs:
        run("sqlite, new", "sqlite", args.agents)
    if "postgres" in runs:
        replicas("postgres, 2 replicas: B", stream=False)
    if "stream-sqlite" in runs:
        run("sqlite, stream", "sqlite", args.agents, stream=True)
    if "stream-postgres" in runs:
        replicas("postgres, streams on B", stream=True)


if __name__ == "__main__":
    main()
