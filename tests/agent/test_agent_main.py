"""Settings refused at start, and ``railover-agent`` as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.config import AgentSettings, describe_errors
from railover_testing.agents import StandInService, short_socket_path
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import FixtureNode
from railover_testing.waiting import wait_until
from tests.deploy.tools import need_console_script

AGENT = Path(sys.executable).with_name("railover-agent")


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILOVER_AGENT_")}
    env.update({f"RAILOVER_AGENT_{k.upper()}": v for k, v in values.items()})
    return env


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"service_url": "ftp://x"}, "RAILOVER_AGENT_SERVICE_URL"),
        ({"service_url": "http://10.0.0.1:8080", "token": "t"}, "plain http"),
        ({"service_url": "https://svc.example:8443"}, "token is required"),
        ({"node_name": "bad name!"}, "RAILOVER_AGENT_NODE_NAME"),
        ({"sysfs_root": "/nonexistent"}, "RAILOVER_AGENT_SYSFS_ROOT"),
        ({"rail_map": "/nonexistent.json"}, "RAILOVER_AGENT_RAIL_MAP"),
        ({"poll_interval_s": "0"}, "RAILOVER_AGENT_POLL_INTERVAL_S"),
        ({"batch_max": "5000"}, "RAILOVER_AGENT_BATCH_MAX"),
        ({"disabled_collectors": "ports,nosuch"}, "nosuch"),
    ],
)
def test_unsafe_or_invalid_settings_are_refused(
    values: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in _env(**values).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValidationError) as exc:
        AgentSettings()
    assert message in describe_errors(exc.value)


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k, v in _env(
        service_url="https://svc.example:8443/",
        token="secret",
        node_name="gpu-node-17",
        sysfs_root=str(tmp_path),
        disabled_collectors="pcie, counters",
        counter_events="link_downed,symbol_error",
    ).items():
        monkeypatch.setenv(k, v)
    s = AgentSettings()
    assert s.service_url == "https://svc.example:8443"
    assert s.disabled_collectors == ["pcie", "counters"]
    assert s.counter_events == ["link_downed", "symbol_error"]
    assert s.bearer() == {"Authorization": "Bearer secret"}
    assert "secret" not in repr(s)
    assert s.socket == Path("/run/railover/agent.sock")
    assert s.poll_interval_s == 1.0


def test_console_script_refuses_bad_settings() -> None:
    need_console_script("railover-agent")
    r = subprocess.run(
        [str(AGENT)],
        check=False,
        env=_env(service_url="http://10.1.2.3:8080", sysfs_root="/nonexistent"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "refusing to start" in r.stderr
    assert "RAILOVER_AGENT_SYSFS_ROOT" in r.stderr


def test_console_script_refuses_a_broken_rail_map(tmp_path: Path, node_a: FixtureNode) -> None:
    need_console_script("railover-agent")
    rails = tmp_path / "rails.yaml"
    rails.write_text("mlx5_0: {switch: a, rail: 0}\n")
    r = subprocess.run(
        [str(AGENT)],
        check=False,
        env=_env(
            sysfs_root=str(node_a.root),
            rail_map=str(rails),
            spool_dir=str(tmp_path / "spool"),
            metrics_port="0",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "refusing to start" in r.stderr and "bad key 'mlx5_0'" in r.stderr


def test_console_script_runs_and_stops_cleanly(
    node_a: FixtureNode, rail_map_a: Path, tmp_path: Path, standin: StandInService
) -> None:
    need_console_script("railover-agent")
    sock = short_socket_path()
    env = _env(
        service_url=standin.url,
        node_name="n0",
        sysfs_root=str(node_a.root),
        proc_root="/proc",
        rail_map=str(rail_map_a),
        spool_dir=str(tmp_path / "spool"),
        socket=str(sock),
        metrics_host="127.0.0.1",
        metrics_port="0",
        poll_interval_s="0.2",
    )
    log = tmp_path / "agent.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(AGENT)], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        assert standin.wait_for(lambda s: "n0" in s.nodes, timeout=20), log.read_text()
        set_port_state(node_a.root, "mlx5_1", 1, "DOWN")
        assert standin.wait_for(
            lambda s: any(e["kind"] == "port_down" for e in s.events.values()), timeout=5
        )
        assert sock.exists()
        port = None
        for line in log.read_text().splitlines():
            if "/metrics on port" in line:
                port = int(line.rsplit(" ", 1)[1])
        assert port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert json.loads(r.read())["status"] == "ok"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        # Its own cost, read from PROC_ROOT.
        assert "railover_agent_process_resident_memory_bytes" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
        assert not sock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert wait_until(lambda: "agent stopping" in log.read_text(), timeout=1)
