"""The image as operators run it: read-only root, non-root, the agent on a sysfs tree.

The service container serves /healthz and /readyz; an agent container reads a sysfs
fixture tree mounted read-only at /host/sys and its rail map from a mounted file,
registers its node with that service, and a port going down in the tree becomes a
decision. The agent shares the service container's network namespace, as two
containers of one pod do.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from railover_testing import waiting
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import shape_a, write_rail_map
from tests.image.conftest import Podman
from tests.scheduler_svc.helpers import job_body

PLUGIN = "/opt/railover/lib/librailover_plugin.so"
DB = "sqlite:////var/lib/railover/railover.db"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(what: str, probe: Callable[[], Any], podman: Podman, timeout_s: float = 120) -> Any:
    return waiting.wait_for(
        what, probe, timeout_s, podman.logs, step=0.25, ignoring=(httpx.HTTPError,)
    )


def test_image_layout(podman: Podman) -> None:
    """Non-root, both programs on PATH, the plugin at its documented path."""
    out = podman(
        "run",
        "--rm",
        "--read-only",
        podman.image,
        "sh",
        "-c",
        "id -u; id -g; command -v railover; command -v railover-agent;"
        f" test -r {PLUGIN} && echo plugin; railover --help >/dev/null && echo help",
    )
    assert out.split() == [
        "10001",
        "10001",
        "/opt/railover/venv/bin/railover",
        "/opt/railover/venv/bin/railover-agent",
        "plugin",
        "help",
    ]
    label = podman(
        "image", "inspect", "--format", '{{index .Labels "io.railover.plugin"}}', podman.image
    )
    assert label.strip() == PLUGIN


def test_service_and_agent_containers(podman: Podman, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(0o777)  # the image's user, 10001, writes the SQLite file there
    common = ["--read-only", "--tmpfs", "/tmp", "-e", f"RAILOVER_DB_URL={DB}"]
    volume = ["-v", f"{store}:/var/lib/railover"]
    tokens = dict(
        line.split(" ", 1)
        for line in podman(
            "run", "--rm", *common, *volume, podman.image, "railover", "token", "bootstrap"
        ).splitlines()
    )
    assert set(tokens) == {"fleet", "viewer"}
    agent_token = podman(
        "run",
        "--rm",
        *common,
        *volume,
        podman.image,
        "railover",
        "token",
        "create",
        "--role",
        "agent",
        "--node",
        "node-a",
    )
    port = free_port()
    service = podman.start(
        "railover-svc",
        *common,
        *volume,
        "-p",
        f"127.0.0.1:{port}:8080",
        podman.image,
        "railover",
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
    )
    url = f"http://127.0.0.1:{port}"
    wait_for("/healthz", lambda: httpx.get(f"{url}/healthz", timeout=5).status_code == 200, podman)
    assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200

    def host_dir(name: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        path.chmod(0o777)  # hostPath folders the DaemonSet's init step hands to 10001
        return path

    sysfs = tmp_path / "sys"
    node = shape_a(sysfs)
    rails = write_rail_map(tmp_path / "rails" / "rail-map.json", node.rail_map())
    podman.start(
        "railover-agent",
        "--read-only",
        "--network",
        f"container:{service}",
        "-v",
        f"{sysfs}:/host/sys:ro",
        "-v",
        f"{rails.parent}:/etc/railover/rail-map:ro",
        "--tmpfs",
        "/tmp",
        # host folders, as the DaemonSet's hostPath volumes are
        "-v",
        f"{host_dir('run')}:/run/railover",
        "-v",
        f"{host_dir('spool')}:/var/lib/railover-agent",
        "-e",
        "RAILOVER_AGENT_NODE_NAME=node-a",
        "-e",
        "RAILOVER_AGENT_SERVICE_URL=http://127.0.0.1:8080",
        "-e",
        f"RAILOVER_AGENT_TOKEN={agent_token.strip()}",
        "-e",
        "RAILOVER_AGENT_SYSFS_ROOT=/host/sys",
        "-e",
        "RAILOVER_AGENT_RAIL_MAP=/etc/railover/rail-map/rail-map.json",
        "-e",
        "RAILOVER_AGENT_METRICS_PORT=0",
        "-e",
        "RAILOVER_AGENT_POLL_INTERVAL_S=0.2",
        podman.image,
        "railover-agent",
    )
    fleet = httpx.Client(
        base_url=url, timeout=10, headers={"Authorization": f"Bearer {tokens['fleet']}"}
    )
    registered = wait_for(
        "node-a registered by the agent container",
        lambda: (r := fleet.get("/v1/nodes/node-a")).status_code == 200 and r.json(),
        podman,
    )
    assert registered["name"] == "node-a"
    # A viewer token reads (the status page's), and nothing answers without one.
    viewer = {"Authorization": f"Bearer {tokens['viewer']}"}
    assert httpx.get(f"{url}/v1/fabric", headers=viewer, timeout=10).status_code == 200
    assert httpx.get(f"{url}/v1/fabric", timeout=10).status_code == 401

    body = job_body("job-img", ["node-a"], last_checkpoint_at=datetime.now(UTC).isoformat())
    r = fleet.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    set_port_state(sysfs, "mlx5_0", 1, "DOWN")
    decisions = wait_for(
        "a decision for the port that went down",
        lambda: fleet.get("/v1/jobs/job-img/decisions").json()["decisions"],
        podman,
    )
    assert decisions[0]["action"] in ("failover", "restart", "restart_scaled")
    faults = fleet.get("/v1/fabric").json()["faults"]
    assert any(f["node"] == "node-a" and f["device"] == "mlx5_0" for f in faults), faults
