"""End to end with the real service over loopback: an outage, 1,000 events, an agent restart.

Service down; the agent records 1,000 events (port flips from sysfs and CQE
errors from a plugin client) and is restarted halfway; then the service
starts. All 1,000 must be in the service's database, none twice. Every test here
runs on both stores (the `db_url` fixture: SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from native_plugin import wire, wire_codec
from railover_testing.agents import AgentThread, settings_for
from railover_testing.processes import store_rows
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import FixtureNode
from railover_testing.waiting import wait_until
from tests.agent.polls import PollLog
from tests.deploy.tools import need_console_script

RAILOVER = Path(sys.executable).with_name("railover")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """`railover serve` as its own process on `db_url` (each store backend)."""

    def __init__(self, port: int, db_url: str, log: Path) -> None:
        self.port = port
        self.db_url = db_url
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAILOVER_")}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(RAILOVER),
                    "serve",
                    "--dev",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--db",
                    self.db_url,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        url = f"http://127.0.0.1:{self.port}/healthz"
        proc = self.proc

        def healthy() -> bool:
            assert proc.poll() is None, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        if not wait_until(healthy, timeout=60, step=0.1):
            raise AssertionError(f"service did not start:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def service(tmp_path: Path, db_url: str) -> Iterator[Service]:
    need_console_script("railover")
    svc = Service(_free_port(), db_url, tmp_path / "svc.log")
    yield svc
    svc.stop()


def _cqe(qp: int) -> bytes:
    return wire_codec.encode(
        wire.CqeError(
            timestamp_ns=time.time_ns(),
            port=1,
            qp_num=qp,
            wc_status=12,
            vendor_err=0x81,
            pid=4242,
            dev_name=f"mlx5_{qp % 8}",
            peer="10.0.0.9",
        )
    )


def _send_cqes(a: AgentThread, qps: range) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(a.settings.socket))
    s.sendall(wire_codec.encode(wire.Hello(comm_id=9, pid=4242, abi_version=1, rank=0)))
    s.sendall(b"".join(_cqe(q) for q in qps))
    s.close()


def test_outage_restart_1000_events_all_arrive_once(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, service: Service
) -> None:
    settings = settings_for(
        node_a.root,
        tmp_path / "agent",
        f"http://127.0.0.1:{service.port}",
        rail_map_a,
        retry_max_backoff_s=0.5,
        # A 500-event batch takes seconds on a loaded 2-core machine; a shorter timeout
        # only has the agent resend it while the first copy is still being stored.
        request_timeout_s=30,
    )
    a = AgentThread(settings).start()
    try:
        # 10 port events from sysfs: five ports down, then up, each seen by a poll.
        for dev in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4"):
            for state in ("DOWN", "ACTIVE"):
                want = a.agent.spool.depth() + 1
                set_port_state(node_a.root, dev, 1, state)
                assert wait_until(lambda: a.agent.spool.depth() == want)  # noqa: B023  # waited on at once
        _send_cqes(a, range(0, 495))
        assert wait_until(lambda: a.agent.spool.depth() == 505, timeout=20)
    finally:
        a.stop()

    # The agent restarts midway through the outage.
    a = AgentThread(settings).start()
    try:
        assert a.agent.spool.depth() == 505
        _send_cqes(a, range(495, 990))
        assert wait_until(lambda: a.agent.spool.depth() == 1000, timeout=20)
        spooled: list[tuple[int, dict[str, Any]]] = a.call(lambda: a.agent.spool.peek(5000))
        want_ids = {ev["event_id"] for _, ev in spooled}
        assert len(want_ids) == 1000

        service.start()
        assert wait_until(lambda: a.agent.spool.depth() == 0, timeout=60), (
            f"{a.agent.spool.depth()} events still spooled"
        )
        assert a.call(a.agent.spool.dead_letters) == []
    finally:
        a.stop()

    rows = store_rows(
        service.db_url, "SELECT event_id, kind, device, payload FROM events WHERE node = 'n0'"
    )
    assert len(rows) == 1000
    assert {str(r[0]) for r in rows} == want_ids
    cqe_qps = [_json(r[3])["detail"]["qp_num"] for r in rows if r[1] == "cqe_error"]
    assert sorted(cqe_qps) == list(range(990))  # each generated once, none twice
    ports = sorted((r[2], r[1]) for r in rows if r[1] != "cqe_error")
    assert ports == sorted((f"mlx5_{i}", k) for i in range(5) for k in ("port_down", "port_up"))


def _json(value: Any) -> Any:
    """A JSON column as read: text on SQLite, already decoded on PostgreSQL."""
    return json.loads(value) if isinstance(value, str) else value


def refused() -> float:
    """Calls the service refused with 403 (a token for another node), any endpoint."""
    return sum(
        REGISTRY.get_sample_value(
            "railover_agent_service_requests_total", {"endpoint": e, "outcome": "http_403"}
        )
        or 0.0
        for e in ("register", "events")
    )


def _http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def job_on_n0(last_checkpoint_at: str) -> dict[str, Any]:
    """Job j1: one rank on each of n0's 8 GPUs, checkpointed at `last_checkpoint_at`."""
    return {
        "job_id": "j1",
        "ranks": [{"rank": i, "node": "n0", "gpu": i} for i in range(8)],
        "checkpoint_interval_s": 3600,
        "reload_s": 1800,
        "detect_s": 0,
        "timeout_s": 30,
        "last_checkpoint_at": last_checkpoint_at,
        "slowdown_k": 1.5,
    }


def test_live_service_plan_fault_and_command_relay(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, service: Service
) -> None:
    service.start()
    base = f"http://127.0.0.1:{service.port}"
    interval = 1.0  # the default poll interval
    settings = settings_for(
        node_a.root, tmp_path / "agent", base, rail_map_a, poll_interval_s=interval
    )
    a = AgentThread(settings).start()
    # One CCL process per GPU, as on a training node.
    plugins = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(8)]
    try:
        assert wait_until(lambda: a.agent.registered is not None, timeout=10)
        node = _http("GET", f"{base}/v1/nodes/n0")
        # The service's s-Bond plan for shape (a): every GPU's backup sits behind
        # its own root complex (each switch carries two GPU RNICs), never a storage NIC.
        rc = {r["name"]: r["root_complex"] for r in node["rnics"]}
        gpu_rc = {g["index"]: g["root_complex"] for g in node["gpus"]}
        assert len(node["backup_plan"]) == 8
        for p in node["backup_plan"]:
            backup = p["backup"].split("/")[0]
            assert backup not in ("mlx5_8", "mlx5_9")
            assert rc[backup] == gpu_rc[p["gpu"]], p

        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        _http("POST", f"{base}/v1/jobs", job_on_n0(now))
        for rank, p in enumerate(plugins):
            p.connect(str(settings.socket))
            p.sendall(
                wire_codec.encode(wire.Hello(comm_id=0, pid=100 + rank, abi_version=1, rank=rank))
            )

        polls = PollLog(a, "ports")
        before = polls.mark()
        set_port_state(node_a.root, "mlx5_0", 1, "DOWN")

        def fault_open() -> bool:
            return bool(
                store_rows(
                    service.db_url,
                    "SELECT 1 FROM faults WHERE node='n0' AND device='mlx5_0' "
                    "AND cleared_at IS NULL",
                )
            )

        # Generous (a hung test's stop): the poll count below is the bound.
        assert wait_until(fault_open, timeout=30)
        # Detected by the poll running at the flip, or else by the next one to start:
        # within one poll interval, counted in polls rather than seconds.
        found = polls.found_by(lambda e: e["kind"] == "port_down" and e["device"] == "mlx5_0")
        assert found is not None
        assert before <= found <= before + 1

        # Fault right after a checkpoint: restart is cheaper, so the service
        # tells every rank's process to abort; the agent relays it to the plugin.
        # (The fault commits before the pass that decides on it: wait for the pass.)
        def decided() -> list[dict[str, Any]]:
            listing: list[dict[str, Any]] = _http("GET", f"{base}/v1/jobs/j1/decisions")[
                "decisions"
            ]
            return listing

        assert wait_until(lambda: decided() != [], timeout=30)
        assert [d["action"] for d in decided()] == ["restart"]
        cmds_seen: list[wire.Command] = []
        for rank, p in enumerate(plugins):
            p.settimeout(10)
            dec = wire_codec.FrameDecoder()
            msgs: list[wire.Message] = []
            while not msgs:
                msgs = dec.feed(p.recv(4096))
            (cmd,) = msgs
            assert isinstance(cmd, wire.Command) and cmd.kind == wire.CommandKind.ABORT
            cmds_seen.append(cmd)
            p.sendall(
                wire_codec.encode(wire.Ack(command_id=cmd.command_id, status=0, pid=100 + rank))
            )
        assert len({c.command_id for c in cmds_seen}) == 1
        command_id = cmds_seen[0].command_id

        def acked() -> bool:
            got = _http("GET", f"{base}/v1/jobs/j1/commands")
            cmds = got["commands"] if isinstance(got, dict) else got
            return any(c["command_id"] == command_id and c["state"] == "applied" for c in cmds)

        assert wait_until(acked, timeout=10, step=0.1)
    finally:
        for p in plugins:
            p.close()
        a.stop()


def _token(service: Service, node: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILOVER_")}
    r = subprocess.run(
        [
            str(RAILOVER),
            "token",
            "create",
            "--role",
            "agent",
            "--node",
            node,
            "--db",
            service.db_url,
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return r.stdout.strip().splitlines()[-1]


def test_wrong_token_keeps_events_until_the_right_one(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, service: Service
) -> None:
    good, other = _token(service, "n0"), _token(service, "n1")
    service.start()
    base = f"http://127.0.0.1:{service.port}"
    # A token for another node: the service refuses it; nothing may be lost.
    settings = settings_for(node_a.root, tmp_path / "agent", base, rail_map_a, token=other)
    a = AgentThread(settings).start()
    try:
        set_port_state(node_a.root, "mlx5_2", 1, "DOWN")
        assert wait_until(lambda: a.agent.spool.depth() == 1)
        # Several refused attempts (counted), each keeping the event in the spool.
        first = refused()
        assert wait_until(lambda: refused() >= first + 3, timeout=30)
        assert a.agent.spool.depth() == 1
        assert a.agent.registered is None
        assert a.call(a.agent.spool.dead_letters) == []
    finally:
        a.stop()
    settings = settings_for(node_a.root, tmp_path / "agent", base, rail_map_a, token=good)
    a = AgentThread(settings).start()
    try:
        assert wait_until(lambda: a.agent.spool.depth() == 0, timeout=10)
    finally:
        a.stop()
    rows = store_rows(service.db_url, "SELECT kind, device FROM events WHERE node = 'n0'")
    assert rows == [("port_down", "mlx5_2")]
