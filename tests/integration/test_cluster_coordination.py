"""The whole control plane at once: service, four agents and a 32-rank job on the real plugin.

The service runs over loopback HTTP on SQLite and PostgreSQL; each of four nodes
(8 GPUs, 8 RNICs on 8 rails) has an in-process agent reading its own generated
sysfs tree; the job's 32 ranks are threads of ``railover_testing.simjob`` that each
hold a plugin handle connected to their node's agent. Faults are injected the way
they arise: a port state flipping in sysfs, or a CQE error the CCL reports.
"""

from __future__ import annotations

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
from railover_testing.simjob import Applied, SimulatedJob
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import FixtureNode, build_cluster

NODES = ("n0", "n1", "n2", "n3")
GPUS = 8
JOB = "llm"
COMM = 77
CHANNELS = 16
# Trigger offset floor, in ops. The service counts from the newest progress it
# holds, which is an agent poll (0.2 s) plus a POST old, and measures delivery
# latency only up to the agent's fetch; at ~150 ops/s on a busy 2-core box the
# ranks need about a second and a half of ops to be sure to arm in time.
MIN_OFFSET = 250
# Ranks report every few ops (a real CCL would too): 32 ranks x 200 ops/s of frames
# would otherwise cost the four agents more CPU than the two cores have.
PROGRESS_EVERY = 10

SERVICE: dict[str, Any] = {
    "coordinator_interval_s": 0.1,
    "command_ack_timeout_s": 30.0,
    "switch_min_offset_ops": MIN_OFFSET,
    "delivery_latency_default_s": 0.5,
}


@dataclass
class Cluster:
    http: httpx.Client
    nodes: dict[str, FixtureNode]
    agents: dict[str, AgentThread]

    def job(self, **kw: Any) -> SimulatedJob:
        placement = [(i * GPUS + g, n, g) for i, n in enumerate(NODES) for g in range(GPUS)]
        sockets = {n: a.settings.socket for n, a in self.agents.items()}
        return SimulatedJob(
            JOB, COMM, placement, sockets, channels=CHANNELS, progress_every=PROGRESS_EVERY, **kw
        )

    def commands(self, kind: str | None = None) -> list[dict[str, Any]]:
        r = self.http.get(f"/v1/jobs/{JOB}/commands")
        assert r.status_code == 200, r.text
        cmds: list[dict[str, Any]] = r.json()["commands"]
        return [c for c in cmds if kind is None or c["kind"] == kind]

    def decisions(self) -> list[dict[str, Any]]:
        r = self.http.get(f"/v1/jobs/{JOB}/decisions")
        assert r.status_code == 200, r.text
        out: list[dict[str, Any]] = r.json()["decisions"]
        return out


def wait_for(
    what: str, check: Callable[[], bool], timeout_s: float, detail: Callable[[], Any]
) -> None:
    """Poll ``check`` (bounded); on timeout fail with ``what`` and the state ``detail`` shows."""
    waiting.wait_for(what, check, timeout_s, detail)


@pytest.fixture
def cluster(db_url: str, plugin_lib: Path, tmp_path: Path) -> Iterator[Cluster]:
    """Service, four registered nodes with running agents, and the job registered."""
    built = build_cluster(tmp_path / "nodes", NODES)
    # The service is its own process, as in production: the 32 rank threads and four agents
    # of this process would otherwise starve its request threads of the GIL on two cores.
    env = {f"RAILOVER_{k.upper()}": str(v) for k, v in SERVICE.items()}
    service = Service(db_url, tmp_path, env=env).start()
    url = service.url
    # Idle connections go before the server's 5 s keep-alive could close one under a request.
    limits = httpx.Limits(keepalive_expiry=1.0)
    try:
        with (
            httpx.Client(base_url=url, timeout=10, limits=limits) as http,
            node_agents(
                built,
                tmp_path / "agents",
                url,
                register_timeout_s=10,
                poll_interval_s=0.2,
                command_wait_s=0.5,
                command_hold_s=5.0,
                # Generous: a starved 2-core box can take seconds to answer, and a retried
                # ack only adds to the queue it waited in.
                request_timeout_s=10.0,
            ) as agents,
        ):
            # Fifty minutes into an hour between checkpoints: failing over beats restarting.
            checkpoint = datetime.now(UTC) - timedelta(seconds=3000)
            body = {
                "job_id": JOB,
                "ranks": [
                    {"rank": i * GPUS + g, "node": n, "gpu": g}
                    for i, n in enumerate(NODES)
                    for g in range(GPUS)
                ],
                "checkpoint_interval_s": 3600,
                "reload_s": 600,
                "detect_s": 0,
                "timeout_s": 30,
                "last_checkpoint_at": checkpoint.isoformat(),
                "slowdown_k": 1.5,
                "communicators": [{"comm_id": COMM, "channels": CHANNELS, "ranks": []}],
            }
            r = http.post("/v1/jobs", json=body)
            assert r.status_code == 201, r.text
            yield Cluster(http, {n: node for n, (node, _) in built.items()}, agents)
    finally:
        service.stop()


def warm_up(cluster: Cluster, job: SimulatedJob) -> None:
    """Let the ranks run long enough that the service holds their progress and op rate."""
    assert job.wait_ops(50, 15), f"the job did not get going: ops_done={job.ops_done}"

    def progress() -> list[dict[str, Any]]:
        r = cluster.http.get(f"/v1/jobs/{JOB}/progress")
        assert r.status_code == 200, r.text
        out: list[dict[str, Any]] = r.json()["progress"]
        return out

    # Two samples per rank give the service each rank's op rate, which places switch points.
    wait_for(
        "the service to hold an op rate for every rank",
        lambda: sum(p["rate_ops_per_s"] is not None for p in progress()) == len(NODES) * GPUS,
        20,
        progress,
    )


def failover_decision(cluster: Cluster) -> dict[str, Any]:
    wait_for(
        "a failover decision",
        lambda: any(d["action"] == "failover" for d in cluster.decisions()),
        10,
        cluster.decisions,
    )
    decision = next(d for d in cluster.decisions() if d["action"] == "failover")
    (comm,) = decision["plan"]["communicators"]
    assert comm["comm_id"] == COMM
    # Both channel-level plans (DCR, and balance built on it) switch at one op.
    assert comm["mitigation"] in {"dcr", "balance"}, comm
    assert comm["disabled_channels"], comm
    return decision


def newest(cluster: Cluster, epoch: int) -> list[dict[str, Any]]:
    """The switch-point commands (R²CCL balance here) of one epoch."""
    return [c for c in cluster.commands("balance") if c["epoch"] == epoch]


def all_applied(job: SimulatedJob, count: int = 1) -> Callable[[], bool]:
    return lambda: all(len(a) >= count for a in job.applied().values())


def summary(job: SimulatedJob) -> Callable[[], Any]:
    return lambda: {
        "ops_done": job.ops_done,
        "received": {
            r: [(x.command.epoch, x.command.ops_done, x.at_ops_done) for x in lg.received]
            for r, lg in job.logs().items()
        },
        "applied": {r: [x.plan for x in a] for r, a in job.applied().items() if a},
        "acks": {r: [(a.command_id, a.status) for a in lg.acks] for r, lg in job.logs().items()},
    }


def assert_no_divergence(applied: dict[int, list[Applied]]) -> None:
    """No rank applied two different plans for one op, and every rank applied the same list."""
    for rank, entries in applied.items():
        per_op: dict[int, set[tuple[int, int, int, tuple[int, ...]]]] = {}
        for a in entries:
            per_op.setdefault(a.op, set()).add(a.plan)
        assert all(len(p) == 1 for p in per_op.values()), f"rank {rank} applied {per_op}"
    lists = {tuple(a.plan for a in entries) for entries in applied.values()}
    assert len(lists) == 1, f"ranks diverged: {sorted(lists)}"


def test_rnic_failure_every_rank_switches_at_the_same_op(cluster: Cluster) -> None:
    with cluster.job(op_interval_s=0.008) as job:
        warm_up(cluster, job)
        ops_at_fault = job.ops_done
        set_port_state(cluster.nodes["n1"].root, "mlx5_3", 1, "DOWN")
        decision = failover_decision(cluster)
        wait_for("all 32 ranks to apply the plan", all_applied(job), 20, summary(job))
        (plan,) = job.applied()[0]
        wait_for(
            "the service to record the switch point applied on every node",
            lambda: {c["state"] for c in newest(cluster, plan.epoch)} == {"applied"},
            10,
            cluster.commands,
        )
    applied = job.applied()
    assert len(applied) == 32
    assert_no_divergence(applied)
    # One switch point: one command per node, same trigger, epoch and channels. With
    # the offset above it is the first one; a host stalled past it would show a second
    # epoch here, applied just as consistently, and the first never applied anywhere.
    final = newest(cluster, plan.epoch)
    assert sorted(c["node"] for c in final) == list(NODES)
    assert {(c["ops_done"], tuple(c["disabled_channels"])) for c in final} == {
        (plan.op, plan.disabled_channels)
    }
    older = [c for c in cluster.commands("balance") if c["epoch"] < plan.epoch]
    assert {c["state"] for c in older} <= {"superseded", "failed"}
    assert plan.kind == CommandKind.BALANCE
    assert plan.op > ops_at_fault
    assert list(plan.disabled_channels) == decision["plan"]["communicators"][0]["disabled_channels"]
    assert plan.disabled_channels  # the DCR equivalent an ABI 1 CCL would run
    assert plan.weights and len(plan.weights) == CHANNELS  # what this one runs
    # Each rank acked exactly its own node's command, once, applied.
    by_node = {c["node"]: c["command_id"] for c in final}
    for rank, lg in job.logs().items():
        switch_acks = [a for a in lg.acks if a.command_id in by_node.values()]
        assert [(a.command_id, a.status) for a in switch_acks] == [
            (by_node[lg.node], AckStatus.APPLIED)
        ], rank


def test_slow_rank_past_the_trigger_gets_a_new_epoch_and_nobody_diverges(
    cluster: Cluster,
) -> None:
    slow = 13  # n1, GPU 5
    with cluster.job(op_interval_s=0.008, slow_rank=slow, slow_commands=1) as job:
        warm_up(cluster, job)
        set_port_state(cluster.nodes["n2"].root, "mlx5_6", 1, "DOWN")
        failover_decision(cluster)
        wait_for("all 32 ranks to apply the plan", all_applied(job), 25, summary(job))
        wait_for(
            "the service to record the newest epoch applied on every node",
            lambda: (
                sorted(
                    c["node"]
                    for c in cluster.commands("balance")
                    if c["state"] == "applied" and c["epoch"] > first_epoch(cluster)
                )
                == list(NODES)
            ),
            30,
            cluster.commands,
        )
        # Some more ops go by: nothing else may be applied in them.
        more = job.ops_done + 40
        assert job.wait_ops(more, 15), f"the job stalled: ops_done={job.ops_done}"
    applied = job.applied()
    assert_no_divergence(applied)
    (plan,) = applied[slow]
    rebalance = cluster.commands("balance")
    first = [c for c in rebalance if c["epoch"] == first_epoch(cluster)]
    final = [c for c in rebalance if c["epoch"] == plan.epoch]
    # Usually the next epoch; on a loaded machine the re-trigger itself may come too
    # late for someone and a third follows. Either way, one plan at one op for all.
    assert plan.epoch > first_epoch(cluster), summary(job)()
    assert len(first) == len(NODES) and {c["ops_done"] for c in first} != {plan.op}
    (trigger1,) = {c["ops_done"] for c in first}
    assert plan.op > trigger1
    # The old epoch was superseded or answered too late, never applied.
    assert {c["state"] for c in first} <= {"superseded", "failed"}
    assert {(c["ops_done"], c["state"]) for c in final} == {(plan.op, "applied")}
    # The slow rank saw the first epoch only after passing it and said so.
    slow_log = job.log(slow)
    epoch1_id = next(c["command_id"] for c in first if slow in c["ranks"])
    ack = next(a for a in slow_log.acks if a.command_id == epoch1_id)
    assert ack.status == AckStatus.TOO_LATE and ack.at_ops_done >= trigger1


def first_epoch(cluster: Cluster) -> int:
    """The epoch of the first balance switch point (epochs count over every kind)."""
    epochs: list[int] = [c["epoch"] for c in cluster.commands("balance")]
    return min(epochs)


def test_command_reaches_only_the_right_node_and_its_ack_is_stored(cluster: Cluster) -> None:
    with cluster.job(op_interval_s=0.008) as job:
        warm_up(cluster, job)
        # The CCL on n2, GPU 1 (rank 17) sees its QPs fail with retries exhausted.
        assert job.plugin(17).report_cqe_error("mlx5_1", 1, 4242, 12, 0x81, "10.0.0.9")
        decision = failover_decision(cluster)
        moved = {(m["node"], m["rank"]) for m in decision["plan"]["failed_over"]}
        assert moved == {("n2", 17)}, decision["plan"]["failed_over"]
        wait_for(
            "the failover command to be acknowledged",
            lambda: [c["state"] for c in cluster.commands("failover")] == ["applied"],
            10,
            cluster.commands,
        )
    (cmd,) = cluster.commands("failover")
    assert (cmd["node"], cmd["ranks"]) == ("n2", [17])
    logs = job.logs()
    got = {
        r
        for r, lg in logs.items()
        if any(x.command.kind == CommandKind.FAILOVER for x in lg.received)
    }
    assert got == {17}, "only the process of rank 17, on n2, may see the failover command"
    (received,) = [x.command for x in logs[17].received if x.command.kind == CommandKind.FAILOVER]
    assert received.command_id == cmd["command_id"]
    assert [
        (a.command_id, a.status) for a in logs[17].acks if a.command_id == cmd["command_id"]
    ] == [(cmd["command_id"], AckStatus.APPLIED)]
    # Whatever the ranks applied of the switch point that came with it, they applied alike.
    assert_no_divergence(job.applied())
