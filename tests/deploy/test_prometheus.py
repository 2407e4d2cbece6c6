"""Alert rules under promtool, and a real Prometheus scraping the service and an agent.

The end-to-end test runs Debian's prometheus on loopback with a 1 s scrape and rule
interval against the service (in this process) and `railover-agent` (a real process
on a generated sysfs tree), then takes an RNIC port down and waits for its alert.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from railover_testing.local import free_port, local_service
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import rail_node, write_rail_map
from railover_testing.waiting import wait_until
from scheduler_svc.config import Settings
from tests.deploy.tools import need_tool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "railover-alerts.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "railover-alerts.test.yaml"
BIN = Path(sys.executable).parent
WAIT_S = 45.0


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [need_tool("promtool"), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_rules_are_valid() -> None:
    r = promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 9 rules found" in r.stdout


def test_rules_unit_tests_pass() -> None:
    r = promtool("test", "rules", str(RULE_TESTS))
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_the_issue_asks_for_exists_and_is_tested() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    wanted = {
        "RailoverRnicDown",
        "RailoverJobFailedOverTooLong",
        "RailoverSwitchFaultInferred",
        "RailoverAgentSpoolGrowing",
        "RailoverAgentSilent",
        "RailoverDecisionLatencyHigh",
        "RailoverCommandNotAcknowledged",
    }
    assert wanted <= alerts
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tested = {
        a["alertname"] for t in tests["tests"] for a in t["alert_rule_test"] if a["exp_alerts"]
    }
    assert tested == alerts, f"alerts never shown firing in a unit test: {alerts - tested}"


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    last: list[Any] = [None]

    def ready() -> bool:
        try:
            last[0] = check()
        except httpx.HTTPError as exc:
            last[0] = exc
        return bool(last[0]) and not isinstance(last[0], Exception)

    if not wait_until(ready, timeout=timeout, step=0.3):
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last: {last[0]!r}")
    return last[0]


@pytest.fixture
def agent_tree(tmp_path: Path) -> tuple[Path, Path]:
    node = rail_node(tmp_path / "sys")
    return node.root, write_rail_map(tmp_path / "rail_map.json", node.rail_map())


@pytest.fixture
def stack(tmp_path: Path, agent_tree: tuple[Path, Path]) -> Iterator[dict[str, str]]:
    """Service, agent and Prometheus on loopback; yields their base URLs."""
    prometheus = need_tool("prometheus")
    sysfs, rail_map = agent_tree
    settings = Settings(
        db_url=f"sqlite:///{tmp_path / 'railover.db'}", port=0, allow_anonymous_loopback=True
    )
    with local_service(settings) as service:
        agent_port, prom_port = free_port(), free_port()
        env = os.environ | {
            "RAILOVER_AGENT_SERVICE_URL": service,
            "RAILOVER_AGENT_NODE_NAME": "gpu-node-7",
            "RAILOVER_AGENT_SYSFS_ROOT": str(sysfs),
            "RAILOVER_AGENT_RAIL_MAP": str(rail_map),
            "RAILOVER_AGENT_SPOOL_DIR": str(tmp_path / "spool"),
            "RAILOVER_AGENT_SOCKET": str(Path("/tmp") / f"ra-prom-{agent_port}.sock"),
            "RAILOVER_AGENT_METRICS_HOST": "127.0.0.1",
            "RAILOVER_AGENT_METRICS_PORT": str(agent_port),
            "RAILOVER_AGENT_POLL_INTERVAL_S": "0.2",
            "RAILOVER_AGENT_COMMAND_WAIT_S": "1",
        }
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "railover",
                    "static_configs": [{"targets": [service.removeprefix("http://")]}],
                },
                {
                    "job_name": "railover-agent",
                    "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}],
                },
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = (tmp_path / "logs").open("w")
        procs = [
            subprocess.Popen([str(BIN / "railover-agent")], env=env, stdout=log, stderr=log),
            subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=log,
                stderr=log,
            ),
        ]
        try:
            yield {
                "service": service,
                "agent": f"http://127.0.0.1:{agent_port}",
                "prometheus": f"http://127.0.0.1:{prom_port}",
                "sysfs": str(sysfs),
                "logs": str(tmp_path / "logs"),
            }
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
            log.close()


def query(prom: httpx.Client, expr: str) -> list[dict[str, Any]]:
    r = prom.get("/api/v1/query", params={"query": expr})
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


@pytest.mark.slow
def test_prometheus_scrapes_service_and_agent(stack: dict[str, str]) -> None:
    with httpx.Client(base_url=stack["prometheus"], timeout=5) as prom:
        wait_for("Prometheus ready", lambda: prom.get("/-/ready").status_code == 200)
        expected = {
            'up{job="railover"} == 1': 1,
            'up{job="railover-agent"} == 1': 1,
            # The agent registered its node with the service, which sees all 8 rails up.
            'railover_rnic_ports{health="ok"} == 1': 8,
            'railover_agent_port_active{job="railover-agent"} == 1': 8,
            "railover_agent_service_up == 1": 1,
            'railover_agent_collector_success{collector="ports"} == 1': 1,
            "railover_agent_spool_events": 1,
            "railover_jobs": 3,
            "railover_http_request_duration_seconds_count": 1,
            "railover_agent_process_resident_memory_bytes": 1,
        }
        for expr, at_least in expected.items():
            wait_for(expr, lambda e=expr, n=at_least: len(query(prom, e)) >= n)  # type: ignore[misc]

        # A port goes down on the node: agent -> service -> fault -> gauge -> alert.
        set_port_state(Path(stack["sysfs"]), "mlx5_3", 1, "DOWN")
        down = 'railover_rnic_unhealthy{node="gpu-node-7", device="mlx5_3"} == 1'
        wait_for(down, lambda: query(prom, down))
        wait_for(
            "the agent's own view",
            lambda: query(prom, 'railover_agent_port_active{device="mlx5_3"} == 0'),
        )

        def rnic_alert() -> list[dict[str, Any]]:
            alerts = prom.get("/api/v1/alerts").json()["data"]["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "RailoverRnicDown"]

        alert = wait_for("RailoverRnicDown pending", rnic_alert)[0]
        assert alert["labels"]["node"] == "gpu-node-7"
        assert alert["labels"]["rail"] == "3"
        groups = prom.get("/api/v1/rules").json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) == 9
        assert all(r["health"] == "ok" for r in rules), [r for r in rules if r["health"] != "ok"]
