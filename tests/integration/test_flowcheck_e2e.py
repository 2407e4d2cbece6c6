"""FlowCheck end to end: a lost iteration reaches every rank as checkpoint_now, and the fleet.

The service runs over loopback HTTP on SQLite and PostgreSQL; two nodes each have an
in-process agent on a generated sysfs tree; the job's four ranks are threads of
``railover_testing.simjob`` holding real plugin handles. A checkpoint node reports an
iteration it could not rebuild: each rank takes a CHECKPOINT_NOW through the plugin
and acks it, the service marks the commands applied, and a subscribed receiver gets
io.railover.job.checkpoint_requested. A newer normal checkpoint ends the request.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from native_plugin.wire import AckStatus, CommandKind
from railover_testing.agents import AgentThread, node_agents
from railover_testing.local import local_service
from railover_testing.simjob import SimulatedJob
from railover_testing.sysfs_node import build_cluster
from railover_testing.waiting import wait_for
from railover_testing.webhook_receivers import post_receiver
from scheduler_svc.config import Settings

NODES = ("n0", "n1")
GPUS = 2
JOB = "flow"
COMM = 91
SECRET = "test-secret-0123456789abcdef"
REQUESTED = "io.railover.job.checkpoint_requested"


@dataclass
class Receiver:
    """Records the CloudEvents a subscription delivers."""

    url: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def got(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.events)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()

    def record(body: bytes) -> None:
        with rec.lock:
            rec.events.append(json.loads(body))

    with post_receiver(record) as rec.url:
        yield rec


@dataclass
class Stack:
    http: httpx.Client
    agents: dict[str, AgentThread]

    def job(self) -> SimulatedJob:
        placement = [(i * GPUS + g, n, g) for i, n in enumerate(NODES) for g in range(GPUS)]
        sockets = {n: a.settings.socket for n, a in self.agents.items()}
        return SimulatedJob(JOB, COMM, placement, sockets, channels=4, progress_every=10)

    def checkpoint_commands(self) -> list[dict[str, Any]]:
        r = self.http.get(f"/v1/jobs/{JOB}/commands")
        assert r.status_code == 200, r.text
        return [c for c in r.json()["commands"] if c["kind"] == "checkpoint_now"]


@pytest.fixture
def stack(db_url: str, plugin_lib: Path, tmp_path: Path) -> Iterator[Stack]:
    built = build_cluster(tmp_path / "nodes", NODES, gpus=GPUS, rnics=2, switches=2)
    settings = Settings(
        db_url=db_url,
        port=0,
        allow_anonymous_loopback=True,
        webhook_allow_loopback=True,  # the job's notify_url receiver listens on loopback
        webhook_backoff_base_s=0.05,
        webhook_backoff_max_s=0.2,
        delivery_poll_s=0.05,
    )
    with (
        local_service(settings) as url,
        httpx.Client(base_url=url, timeout=10) as http,
        node_agents(
            built,
            tmp_path / "agents",
            url,
            register_timeout_s=15,
            poll_interval_s=0.1,
            command_wait_s=0.5,
        ) as agents,
    ):
        body = {
            "job_id": JOB,
            "ranks": [
                {"rank": i * GPUS + g, "node": n, "gpu": g}
                for i, n in enumerate(NODES)
                for g in range(GPUS)
            ],
            "checkpoint_interval_s": 3600,
            "reload_s": 600,
            "timeout_s": 30,
            "last_checkpoint_at": (datetime.now(UTC) - timedelta(seconds=60)).isoformat(),
            "communicators": [{"comm_id": COMM, "channels": 4, "ranks": []}],
        }
        r = http.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        yield Stack(http, agents)


def test_a_mirror_failure_reaches_every_rank_through_the_plugin_and_the_fleet(
    stack: Stack, receiver: Receiver
) -> None:
    http = stack.http
    r = http.post(
        "/v1/subscriptions",
        json={"url": receiver.url, "secret": SECRET, "event_types": [REQUESTED]},
    )
    assert r.status_code == 201, r.text
    with stack.job() as job:
        assert job.wait_ops(20, 15), f"the job did not get going: ops_done={job.ops_done}"
        failed_at = datetime.now(UTC) - timedelta(seconds=1)
        r = http.post(
            f"/v1/jobs/{JOB}/mirror-failures",
            json={"iteration": 4200, "at": failed_at.isoformat()},
        )
        assert r.status_code == 201, r.text

        def taken() -> dict[int, list[Any]]:
            return {rank: log.checkpoints for rank, log in job.logs().items()}

        def acked() -> dict[int, list[Any]]:
            return {rank: [a.status for a in log.acks] for rank, log in job.logs().items()}

        # A rank records the command when it takes it and its ack right after: wait for both.
        wait_for(
            "every rank to take the checkpoint request and acknowledge it",
            lambda: (
                all(len(c) == 1 for c in taken().values())
                and all(AckStatus.APPLIED in a for a in acked().values())
            ),
            20,
            lambda: (taken(), acked()),
        )
        for rank, log in job.logs().items():
            ((_, cmd),) = log.checkpoints
            # Through the plugin (poll_command_v2): kind 5, now, for the process, with the
            # iteration that could not be rebuilt.
            assert (cmd.kind, cmd.ops_done, cmd.comm_id, cmd.iteration) == (
                CommandKind.CHECKPOINT_NOW,
                0,
                0,
                4200,
            )
            assert [a.status for a in log.acks if a.command_id == cmd.command_id] == [
                AckStatus.APPLIED
            ], rank
        wait_for(
            "both nodes' checkpoint_now commands to be applied",
            lambda: [c["state"] for c in stack.checkpoint_commands()] == ["applied", "applied"],
            20,
            stack.checkpoint_commands,
        )
        cmds = stack.checkpoint_commands()
        assert [(c["node"], c["ranks"], c["iteration"]) for c in cmds] == [
            ("n0", [0, 1], 4200),
            ("n1", [2, 3], 4200),
        ]
        ids = {r: log.checkpoints[0][1].command_id for r, log in job.logs().items()}
        assert ids == {0: cmds[0]["command_id"], 1: cmds[0]["command_id"]} | {
            2: cmds[1]["command_id"],
            3: cmds[1]["command_id"],
        }

        (event,) = wait_for("the CloudEvent", receiver.got, 20, receiver.got)
        assert (event["type"], event["subject"], event["partitionkey"]) == (
            REQUESTED,
            f"job/{JOB}",
            JOB,
        )
        data = event["data"]
        assert (data["job_id"], data["after_iteration"], data["failed_iterations"]) == (
            JOB,
            4200,
            [4200],
        )
        assert data["ranks"] == [0, 1, 2, 3]

        # The job checkpoints past the lost iteration: the request ends, nothing more goes out.
        r = http.post(
            f"/v1/jobs/{JOB}/checkpoints",
            json={"at": datetime.now(UTC).isoformat(), "iteration": 4201},
        )
        assert r.status_code == 201 and r.json()["checkpoint_requested_after"] is None
        assert http.get(f"/v1/jobs/{JOB}").json()["checkpoint_requested_after"] is None
        # The replayed report asks nobody again.
        again = http.post(
            f"/v1/jobs/{JOB}/mirror-failures",
            json={"iteration": 4200, "at": failed_at.isoformat()},
        )
        assert again.status_code == 200 and again.json()["checkpoint_requested_after"] is None
        assert [c["command_id"] for c in stack.checkpoint_commands()] == [
            c["command_id"] for c in cmds
        ]
        ops = job.ops_done
        assert job.wait_ops(ops + 20, 15)
        assert all(len(c) == 1 for c in taken().values()), taken()
    assert [e["type"] for e in receiver.got()] == [REQUESTED]
