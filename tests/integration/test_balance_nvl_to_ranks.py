"""R²CCL balance weights and NVL transit GPUs from a decision to the ranks, end to end.

The service over loopback HTTP (its own process, SQLite and PostgreSQL), an in-process
agent per node reading a generated sysfs tree, and a simulated job whose ranks hold
real plugin handles: a fault in sysfs makes the service decide, the command rows carry
the weights or transit GPUs, the agent relays them as COMMAND + extension frames, and
each rank takes them with poll_command_v2 and runs with them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from native_plugin.wire import AckStatus, CommandKind
from railover_testing import waiting
from railover_testing.agents import AgentThread, node_agents
from railover_testing.processes import Service
from railover_testing.simjob import SimulatedJob
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import FixtureNode, build_cluster

NODES = ("n0", "n1")
MIN_OFFSET = 150
SERVICE: dict[str, Any] = {
    "coordinator_interval_s": 0.1,
    "command_ack_timeout_s": 30.0,
    "switch_min_offset_ops": MIN_OFFSET,
    "delivery_latency_default_s": 0.5,
}


def f32(x: float) -> float:
    """What a binary32 on the wire makes of x."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


@dataclass
class Cluster:
    http: httpx.Client
    nodes: dict[str, FixtureNode]
    agents: dict[str, AgentThread]

    def sockets(self) -> dict[str, str]:
        return {n: str(a.settings.socket) for n, a in self.agents.items()}

    def register(self, job_id: str, ranks: list[tuple[int, str, int]], **kw: Any) -> None:
        # Fifty minutes into an hour between checkpoints: failing over beats restarting.
        body = {
            "job_id": job_id,
            "ranks": [{"rank": r, "node": n, "gpu": g} for r, n, g in ranks],
            "checkpoint_interval_s": 3600,
            "reload_s": 600,
            "detect_s": 0,
            "timeout_s": 30,
            "last_checkpoint_at": (datetime.now(UTC) - timedelta(seconds=3000)).isoformat(),
            "slowdown_k": 1.5,
            **kw,
        }
        r = self.http.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text

    def commands(self, job_id: str, kind: str) -> list[dict[str, Any]]:
        r = self.http.get(f"/v1/jobs/{job_id}/commands")
        assert r.status_code == 200, r.text
        return [c for c in r.json()["commands"] if c["kind"] == kind]

    def decisions(self, job_id: str) -> list[dict[str, Any]]:
        r = self.http.get(f"/v1/jobs/{job_id}/decisions")
        assert r.status_code == 200, r.text
        out: list[dict[str, Any]] = r.json()["decisions"]
        return out


def start_cluster(db_url: str, tmp_path: Path, **shape: int) -> Iterator[Cluster]:
    built = build_cluster(tmp_path / "nodes", NODES, **shape)
    env = {f"RAILOVER_{k.upper()}": str(v) for k, v in SERVICE.items()}
    service = Service(db_url, tmp_path, env=env).start()
    try:
        with (
            httpx.Client(base_url=service.url, timeout=10) as http,
            node_agents(
                built,
                tmp_path / "agents",
                service.url,
                register_timeout_s=10,
                poll_interval_s=0.2,
                command_wait_s=0.5,
                command_hold_s=5.0,
                request_timeout_s=10.0,
            ) as agents,
        ):
            yield Cluster(http, {n: node for n, (node, _) in built.items()}, agents)
    finally:
        service.stop()


@pytest.fixture
def rails8(db_url: str, plugin_lib: Path, tmp_path: Path) -> Iterator[Cluster]:
    """Two nodes of 8 GPUs and 8 RNICs, two of each per PCIe switch."""
    yield from start_cluster(db_url, tmp_path, gpus=8, rnics=8, switches=4)


@pytest.fixture
def rails4(db_url: str, plugin_lib: Path, tmp_path: Path) -> Iterator[Cluster]:
    """Two nodes of 8 GPUs and 4 RNICs: one RNIC per PCIe switch and root complex."""
    yield from start_cluster(db_url, tmp_path, gpus=8, rnics=4, switches=4)


def summary(job: SimulatedJob) -> Callable[[], Any]:
    return lambda: {
        "ops_done": job.ops_done,
        "applied": {r: [(a.kind, a.op) for a in x] for r, x in job.applied().items() if x},
        "acks": {r: [(a.command_id, a.status) for a in lg.acks] for r, lg in job.logs().items()},
    }


def test_balance_delivers_its_channel_weights_and_split_to_every_rank(rails8: Cluster) -> None:
    placement = [(i * 8 + g, n, g) for i, n in enumerate(NODES) for g in range(8)]
    rails8.register("bal", placement, communicators=[{"comm_id": 77, "channels": 16}])
    with SimulatedJob(
        "bal", 77, placement, rails8.sockets(), channels=16, op_interval_s=0.008, progress_every=5
    ) as job:
        assert job.wait_ops(40, 15), job.ops_done
        waiting.wait_for(
            "the service to hold an op rate for every rank",
            lambda: (
                all(
                    p["rate_ops_per_s"] is not None
                    for p in rails8.http.get("/v1/jobs/bal/progress").json()["progress"]
                )
                and len(rails8.http.get("/v1/jobs/bal/progress").json()["progress"]) == 16
            ),
            20,
            lambda: rails8.http.get("/v1/jobs/bal/progress").json(),
        )
        set_port_state(rails8.nodes["n1"].root, "mlx5_3", 1, "DOWN")
        waiting.wait_for(
            "every rank to run the balance plan",
            lambda: all(
                any(a.kind == CommandKind.BALANCE for a in x) for x in job.applied().values()
            ),
            30,
            summary(job),
        )
        waiting.wait_for(
            "both nodes' balance commands to be applied",
            lambda: {c["state"] for c in rails8.commands("bal", "balance")} == {"applied"},
            15,
            lambda: rails8.commands("bal", "balance"),
        )
        logs = job.logs()
    # mlx5_3's channels (3, 11) leave through its backup mlx5_2 beside mlx5_2's own
    # (2, 10): that RNIC's seventh of the traffic is split four ways, the others' two.
    expected = tuple(1 / 28 if c % 8 in (2, 3) else 1 / 14 for c in range(16))
    handoff = (1 - 7 / 8) / (1 + (7 / 8) / (2 - 1))
    (decision,) = [d for d in rails8.decisions("bal") if d["action"] == "failover"]
    (comm,) = decision["plan"]["communicators"]
    assert comm["mitigation"] == "balance"
    assert (tuple(comm["channel_weights"]), comm["allreduce_split"]) == (expected, handoff)
    cmds = rails8.commands("bal", "balance")
    assert sorted(c["node"] for c in cmds) == ["n0", "n1"]
    for c in cmds:
        assert tuple(c["channel_weights"]) == expected
        assert c["split_ratio"] == handoff
        assert c["disabled_channels"] == [3, 11]  # the DCR plan an ABI 1 CCL would run
    assert rails8.commands("bal", "rebalance") == []
    by_node = {c["node"]: c["command_id"] for c in cmds}
    wire_weights = tuple(f32(w) for w in expected)
    for rank, lg in logs.items():
        (applied,) = [a for a in job.applied()[rank] if a.kind == CommandKind.BALANCE]
        assert applied.command_id == by_node[lg.node]
        assert (applied.weights, applied.split_ratio) == (wire_weights, f32(handoff))
        assert (lg.channel_weights, lg.split_ratio) == (wire_weights, f32(handoff))
        assert (by_node[lg.node], AckStatus.APPLIED) in [(a.command_id, a.status) for a in lg.acks]
    # Every rank switched at the same op.
    assert (
        len({a.op for x in job.applied().values() for a in x if a.kind == CommandKind.BALANCE}) == 1
    )


def test_nvl_delivers_each_moved_ranks_transit_gpu(rails4: Cluster) -> None:
    # GPU 2 of each node: one rail per node. Its RNIC mlx5_1 fails on n0; the backup,
    # mlx5_0, is behind another root complex, so the service routes rank 0 over NVLink
    # through GPU 0, the GPU beside mlx5_0.
    placement = [(0, "n0", 2), (1, "n1", 2)]
    rails4.register("nvl", placement, communicators=[{"comm_id": 78, "channels": 4}])
    with SimulatedJob(
        "nvl", 78, placement, rails4.sockets(), channels=4, op_interval_s=0.008
    ) as job:
        assert job.wait_ops(20, 15), job.ops_done
        set_port_state(rails4.nodes["n0"].root, "mlx5_1", 1, "DOWN")
        waiting.wait_for(
            "rank 0 to send through its transit GPU",
            lambda: job.log(0).transit_gpu is not None,
            20,
            lambda: rails4.commands("nvl", "nvl_transit"),
        )
        waiting.wait_for(
            "the transit command to be applied",
            lambda: [c["state"] for c in rails4.commands("nvl", "nvl_transit")] == ["applied"],
            15,
            lambda: rails4.commands("nvl", "nvl_transit"),
        )
        logs = job.logs()
    (decision,) = [d for d in rails4.decisions("nvl") if d["action"] == "failover"]
    (comm,) = decision["plan"]["communicators"]
    assert comm["mitigation"] == "nvl"
    assert comm["transit"] == [{"rank": 0, "gpu": 0}]
    (cmd,) = rails4.commands("nvl", "nvl_transit")
    assert (cmd["node"], cmd["ranks"], cmd["transit"]) == ("n0", [0], [[0, 0]])
    assert cmd["transit_mb_per_channel"] == 40
    assert (logs[0].transit_gpu, logs[1].transit_gpu) == (0, None)
    assert [g for _, g in logs[0].transits] == [0]
    assert (cmd["command_id"], AckStatus.APPLIED) in [
        (a.command_id, a.status) for a in logs[0].acks
    ]
    # Only n0's rank was told; rank 1 received no transit command at all.
    assert not any(x.command.kind == CommandKind.NVL_TRANSIT for x in logs[1].received)
    (got,) = [x.command for x in logs[0].received if x.command.kind == CommandKind.NVL_TRANSIT]
    assert (got.transit, got.mb_per_channel) == (((0, 0),), 40)


def test_nvl_over_the_jobs_transit_cap_is_not_commanded(rails4: Cluster) -> None:
    # 4 channels x 40 MB = 160 MB, over this job's 100 MB: s-Bond instead, no transit.
    placement = [(0, "n0", 2), (1, "n1", 2)]
    rails4.register(
        "capped", placement, communicators=[{"comm_id": 79, "channels": 4}], nvl_cap_mb=100.0
    )
    set_port_state(rails4.nodes["n0"].root, "mlx5_1", 1, "DOWN")
    waiting.wait_for(
        "a failover decision",
        lambda: any(d["action"] == "failover" for d in rails4.decisions("capped")),
        15,
        lambda: rails4.decisions("capped"),
    )
    (decision,) = [d for d in rails4.decisions("capped") if d["action"] == "failover"]
    (comm,) = decision["plan"]["communicators"]
    assert comm["mitigation"] == "s-bond"
    nvl = next(o for o in comm["options"] if o["mitigation"] == "nvl")
    assert (nvl["applicable"], nvl["why"]) == (
        False,
        "needs 160 MB of GPU memory, over the 100 MB cap",
    )
    assert rails4.commands("capped", "nvl_transit") == []
    assert [c["ranks"] for c in rails4.commands("capped", "failover")] == [[0]]
    r = rails4.http.get("/v1/jobs/capped")
    assert r.status_code == 200 and r.json()["nvl_cap_mb"] == 100.0
