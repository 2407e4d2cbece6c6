"""Real processes for the crash tests: `railover serve`, `railover-agent`, a PostgreSQL cluster.

Everything here is a separate OS process that the tests kill with SIGKILL or
restart, so what survives is only what the store and the agents' spools hold.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from railover_testing import waiting
from railover_testing.agents import short_socket_path
from railover_testing.local import free_port
from railover_testing.sysfs_node import FixtureNode

BIN = Path(sys.executable).parent
RAILOVER = BIN / "railover"
AGENT = BIN / "railover-agent"


def wait_for(pred: Callable[[], bool], timeout: float, what: str, step: float = 0.05) -> None:
    """Until `pred` holds; a process still starting (refused connection) is "not yet"."""
    waiting.wait_for(what, pred, timeout, step=step, ignoring=(OSError, httpx.HTTPError))


class Service:
    """`railover serve` on a fixed loopback port; killed and restarted on the same one."""

    def __init__(
        self, db_url: str, work: Path, port: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.db_url = db_url
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.work = work
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAILOVER_")}
        self.env.update({"RAILOVER_LOG_LEVEL": "WARNING", **(env or {})})
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Service:
        self.starts += 1
        log = (self.work / f"serve-{self.port}-{self.starts}.log").open("wb")
        self.proc = subprocess.Popen(  # noqa: S603  our own console script
            [str(RAILOVER), "serve", "--dev", "--db", self.db_url, "--port", str(self.port)],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self.ready, 60, f"the service on {self.url}")
        return self

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the service exited with {self.proc.returncode}: {self.log()}")
        return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200

    def log(self) -> str:
        return (self.work / f"serve-{self.port}-{self.starts}.log").read_text(errors="replace")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(15)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Agent:
    """One `railover-agent` process on a fixture node."""

    def __init__(
        self, name: str, node: FixtureNode, rail_map: Path, work: Path, service_url: str
    ) -> None:
        self.name = name
        self.node = node
        self.metrics_port = free_port()
        spool = work / name / "spool"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAILOVER_AGENT_")}
        env.update(
            {
                "RAILOVER_AGENT_SERVICE_URL": service_url,
                "RAILOVER_AGENT_NODE_NAME": name,
                "RAILOVER_AGENT_SYSFS_ROOT": str(node.root),
                "RAILOVER_AGENT_PROC_ROOT": "/proc",
                "RAILOVER_AGENT_RAIL_MAP": str(rail_map),
                "RAILOVER_AGENT_SPOOL_DIR": str(spool),
                "RAILOVER_AGENT_SOCKET": str(short_socket_path()),
                "RAILOVER_AGENT_METRICS_HOST": "127.0.0.1",
                "RAILOVER_AGENT_METRICS_PORT": str(self.metrics_port),
                "RAILOVER_AGENT_POLL_INTERVAL_S": "0.1",
                "RAILOVER_AGENT_RETRY_MAX_BACKOFF_S": "0.5",
                "RAILOVER_AGENT_REQUEST_TIMEOUT_S": "5",
                "RAILOVER_AGENT_COMMAND_WAIT_S": "1",
                "RAILOVER_AGENT_LOG_LEVEL": "WARNING",
            }
        )
        self.log_path = work / name / "agent.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(  # noqa: S603  our own console script
                [str(AGENT)], env=env, stdout=out, stderr=out
            )

    def metrics(self) -> dict[str, float]:
        """Sample name{labels} -> value from its /metrics."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            lines = r.read().decode().splitlines()
        out: dict[str, float] = {}
        for line in lines:
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def spooled(self) -> float:
        return sum(
            v
            for k, v in self.metrics().items()
            if k.startswith("railover_agent_events_spooled_total")
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def stop_all(procs: Iterable[Agent | Service]) -> None:
    for p in procs:
        p.stop()


def store_rows(db_url: str, sql: str) -> list[tuple[Any, ...]]:
    """Read the store directly (SQLite through sqlite3 read-only, PostgreSQL via SQLAlchemy)."""
    if db_url.startswith("sqlite:///"):
        with sqlite3.connect(f"file:{db_url[len('sqlite:///') :]}?mode=ro", uri=True) as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql)).all()]
    finally:
        engine.dispose()


# -- a throw-away PostgreSQL cluster -------------------------------------------------------------


def pg_bindir() -> Path | None:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    return None


class Cluster:
    """initdb + pg_ctl on a free port, owned by an unprivileged user when run as root."""

    def __init__(self) -> None:
        bindir = pg_bindir()
        assert bindir is not None, "PostgreSQL server binaries (initdb, pg_ctl) are needed"
        self.bin = bindir
        self.port = free_port()
        # Its own directory under /tmp: pytest's tmp_path is private to the test's user.
        self.root = Path(tempfile.mkdtemp(prefix="railover-pg-", dir="/tmp"))
        self.dir = self.root / "data"
        self.sock = self.root
        self.user: str | None = None
        if os.geteuid() == 0:
            # initdb refuses to run as root.
            self.user = "postgres" if _has_user("postgres") else "nobody"
            shutil.chown(self.root, self.user)
        self._run("initdb", "-D", str(self.dir), "-U", "postgres", "-A", "trust", "--no-sync")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bin / tool), *args]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)  # noqa: S603

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.dir), "-o", opts, "-w", "-l", str(self.dir / "log"), "start"
        )

    def restart(self) -> None:
        opts = f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.dir), "-o", opts, "-m", "fast", "-w", "restart")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.dir), "-m", "immediate", "-w", "stop")

    def remove(self) -> None:
        """Stop it if running and delete its files."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
