"""`make demo`: the whole control plane on one machine, playing a script of faults.

Everything is real except the hardware: the service on SQLite, four node
agents reading generated sysfs trees (8 GPUs, 8 RNICs on 8 rails each), and
two training jobs whose 16 ranks each are threads using the real native
plugin to report progress and obey commands. Faults are injected the way they
arise, by flipping port state files the agents watch:

1. a 3-second link flap on job A: fail over at once, fail back after damping;
2. an RNIC death early in job B's checkpoint interval; B is communication-bound
   (high k), so restarting from the checkpoint is cheaper;
3. a rail switch failure: three nodes report within a second, the service
   infers the switch, moves every node on it (including the one that has not
   noticed) and rebalances job A's channels at one op count;
4. a planned switch maintenance: job A's ranks on it move before the window
   opens, and fail back at one op count after it (and the damping period).

It runs from a source checkout (`make demo`, or `.venv/bin/python -m railover_testing.demo
[--keep-running]` from the repository root): it is built from the test support, which the
wheel does not ship, so the product's `railover` has no `demo` command.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from native_plugin.abi import library_path
from native_plugin.wire import CommandKind
from railover_testing.agents import AgentThread, settings_for
from railover_testing.local import local_service
from railover_testing.simjob import Applied, SimulatedJob
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import FixtureNode, build_cluster
from scheduler_svc.config import Settings
from scheduler_svc.engine.decision import total_saved_gpu_s
from scheduler_svc.errors import explain
from scheduler_svc.web.render import gpu_hours

NODES = ("n0", "n1", "n2", "n3")
CHANNELS = 16
# Each job has four GPUs on every node: job-a GPUs 0-3 (rails 0-3), job-b 4-7.
JOBS = {
    # job id: (GPUs on each node, communicator id)
    "job-a": ((0, 1, 2, 3), 101),
    "job-b": ((4, 5, 6, 7), 202),
}
# Tuned so the whole script plays in well under two minutes on two cores.
SERVICE: dict[str, Any] = {
    "failback_damping_s": 3.0,
    "maintenance_lead_s": 5.0,
    "coordinator_interval_s": 0.2,
    "switch_min_offset_ops": 250,
    "delivery_latency_default_s": 0.5,
    # Act 3's three port faults reach the service through three agents' port polls; on a
    # loaded machine those can land more than the default 2 s apart, and the switch would
    # then never be inferred. The demo is about what follows the inference.
    "correlation_window_s": 10.0,
    # The demo's agents and its narration call the service on loopback with no token.
    "allow_anonymous_loopback": True,
}


class DemoError(RuntimeError):
    """A step of the script did not happen in time; the message says which."""


@dataclass
class Demo:
    console: Console
    http: httpx.Client
    url: str
    nodes: dict[str, FixtureNode]
    agents: dict[str, AgentThread]
    sims: dict[str, SimulatedJob] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    # --- narration ---------------------------------------------------------------------------
    def say(self, message: str) -> None:
        self.log.append(f"[{time.monotonic() - self.started:5.1f}s] {message}")

    def render(self) -> Group:
        table = Table(title="Jobs", expand=True)
        for col in ("job", "mode", "ops done", "latest decision", "reason"):
            table.add_column(col, overflow="fold")
        for job_id in JOBS:
            try:
                job = self.http.get(f"/v1/jobs/{job_id}").json()
                decisions = self.http.get(f"/v1/jobs/{job_id}/decisions").json()["decisions"]
            except (httpx.HTTPError, KeyError, ValueError):
                continue
            sim = self.sims.get(job_id)
            latest = decisions[0] if decisions else None
            table.add_row(
                job_id,
                str(job.get("mode", "?")),
                str(sim.ops_done) if sim else "-",
                latest["action"] if latest else "-",
                latest["reason"] if latest else "",
            )
        # The live view shows the latest lines; the whole story is printed at the end.
        return Group(table, Text("\n".join(self.log[-12:]), style="dim"))

    # --- helpers -----------------------------------------------------------------------------
    def decisions(self, job_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.http.get(f"/v1/jobs/{job_id}/decisions").json()[
            "decisions"
        ]
        return out

    def wait(self, what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {timeout_s:g} s waiting for {what}")
            time.sleep(0.1)

    def wait_decision(self, job_id: str, action: str, after: int) -> dict[str, Any]:
        self.wait(
            f"{job_id} to decide {action}",
            lambda: (
                len(self.decisions(job_id)) > after
                and self.decisions(job_id)[0]["action"] == action
            ),
        )
        return self.decisions(job_id)[0]

    def register(self, job_id: str, *, checkpoint_age_s: float, **extra: Any) -> None:
        comm = JOBS[job_id][1]
        body = {
            "job_id": job_id,
            "ranks": [{"rank": r, "node": n, "gpu": g} for r, n, g in placement(job_id)],
            "checkpoint_interval_s": 3600,
            "reload_s": 600,
            "detect_s": 0,
            "timeout_s": 30,
            "last_checkpoint_at": (
                datetime.now(UTC) - timedelta(seconds=checkpoint_age_s)
            ).isoformat(),
            "dp_size": len(NODES),
            "communicators": [{"comm_id": comm, "channels": CHANNELS}],
            **extra,
        }
        r = self.http.post("/v1/jobs", json=body)
        if r.status_code != 201:
            raise DemoError(f"registering {job_id} failed: {r.status_code} {r.text}")

    def start_job(self, job_id: str) -> SimulatedJob:
        sockets = {n: self.agents[n].settings.socket for n in NODES}
        sim = SimulatedJob(
            job_id,
            JOBS[job_id][1],
            placement(job_id),
            sockets,
            channels=CHANNELS,
            op_interval_s=0.008,
            progress_every=10,
            max_runtime_s=600,
        ).start()
        self.sims[job_id] = sim
        return sim

    def port(self, node: str, device: str, up: bool) -> None:
        state = "ACTIVE" if up else "DOWN"
        set_port_state(self.nodes[node].root, device, 1, state)


def placement(job_id: str) -> list[tuple[int, str, int]]:
    """(rank, node, GPU) of a job: its GPUs on every node, ranks numbered node by node."""
    gpus = JOBS[job_id][0]
    return [
        (i * len(gpus) + j, node, gpu) for i, node in enumerate(NODES) for j, gpu in enumerate(gpus)
    ]


@contextmanager
def _cluster(console: Console, tmp: Path) -> Iterator[Demo]:
    built = build_cluster(tmp / "nodes", NODES)
    settings = Settings(db_url=f"sqlite:///{tmp / 'railover.db'}", port=0, **SERVICE)
    with ExitStack() as stack:
        url = stack.enter_context(local_service(settings))
        http = stack.enter_context(httpx.Client(base_url=url, timeout=10))
        agents: dict[str, AgentThread] = {}
        for name, (node, rail_map) in built.items():
            agent_settings = settings_for(
                node.root,
                tmp / "agents" / name,
                url,
                rail_map,
                node_name=name,
                poll_interval_s=0.2,
                command_wait_s=0.5,
                command_hold_s=5.0,
            )
            agents[name] = AgentThread(agent_settings).start()
            stack.callback(agents[name].stop)
        demo = Demo(console, http, url, {n: b[0] for n, b in built.items()}, agents)

        def stop_jobs() -> None:
            for sim in demo.sims.values():
                sim.stop()

        stack.callback(stop_jobs)
        demo.wait(
            "every agent to register its node",
            lambda: all(a.agent.registered for a in agents.values()),
        )
        yield demo


def _act_flap(demo: Demo) -> None:
    demo.say("act 1: n0 mlx5_2 flaps for 3 seconds under job-a")
    sim = demo.sims["job-a"]
    seen = _newest_epoch(demo)
    before = len(demo.decisions("job-a"))
    demo.port("n0", "mlx5_2", up=False)
    d = demo.wait_decision("job-a", "failover", before)
    demo.say(f"job-a: {d['action']} ({d['reason']})")
    time.sleep(3)
    demo.port("n0", "mlx5_2", up=True)
    demo.say("n0 mlx5_2 is back; the service waits out the damping period")
    d = demo.wait_decision("job-a", "failback", before + 1)
    demo.say(f"job-a: {d['action']} ({d['reason']})")
    (op, epoch, _kind, _channels), _ = _applied_as_one(
        demo, "the fail-back", (CommandKind.FAILBACK,), seen
    )
    demo.say(
        f"all {len(sim.ranks)} ranks of job-a back on n0 mlx5_2's rail at ops_done {op} "
        f"(epoch {epoch}), as one"
    )


def _applied_as_one(
    demo: Demo, what: str, kinds: tuple[CommandKind, ...], seen: int
) -> tuple[tuple[int, int, int, tuple[int, ...]], tuple[float, ...]]:
    """Wait until every rank of job-a applied a command of `kinds` newer than epoch `seen`;
    the (plan, weights) they all applied last, the same on every rank."""
    sim = demo.sims["job-a"]

    def last(rank: int) -> Applied | None:
        done = [a for a in sim.applied().get(rank, []) if a.kind in kinds and a.epoch > seen]
        return done[-1] if done else None

    demo.wait(
        f"job-a's ranks to apply {what} at one op count",
        lambda: all(last(r) is not None for r in sim.ranks),
        40,
    )
    plans = {(a.plan, a.weights) for a in map(last, sim.ranks) if a is not None}
    if len(plans) != 1:
        raise DemoError(f"job-a's ranks applied {what} at different points: {sorted(plans)}")
    ((plan, weights),) = plans
    return plan, weights


def _newest_epoch(demo: Demo) -> int:
    """The newest epoch any rank of job-a has applied."""
    return max((a.epoch for log in demo.sims["job-a"].applied().values() for a in log), default=0)


def _act_rnic_death(demo: Demo) -> None:
    demo.say("act 2: n2 mlx5_5 dies 5 minutes after job-b's checkpoint")
    before = len(demo.decisions("job-b"))
    demo.port("n2", "mlx5_5", up=False)
    d = demo.wait_decision("job-b", "restart", before)
    demo.say(f"job-b: {d['action']} ({d['reason']})")
    sim = demo.sims["job-b"]
    demo.wait("job-b's ranks to obey the abort", lambda: not sim.running, 15)
    demo.say(f"job-b's ranks aborted at op {sim.ops_done}; the fleet manager restarts it")
    sim.stop()
    demo.port("n2", "mlx5_5", up=True)  # the RNIC was replaced with the node drained
    # Posting the restarting job again is its new incarnation; its history stays.
    demo.register("job-b", checkpoint_age_s=0, comm_share=0.9)
    demo.start_job("job-b")


def _act_switch(demo: Demo) -> None:
    demo.say("act 3: rail switch rail1-a fails; n0, n1, n2 notice within a second, n3 not yet")
    seen = _newest_epoch(demo)
    for node in ("n0", "n1", "n2"):
        demo.port(node, "mlx5_1", up=False)
        time.sleep(0.3)
    demo.wait(
        "the service to infer the switch failure",
        lambda: bool(demo.http.get("/v1/fabric").json()["switch_faults"]),
    )
    for sw in demo.http.get("/v1/fabric").json()["switch_faults"]:
        demo.say(f"switch fault: {sw['switch']} ({sw['reason']})")
    demo.wait(
        "job-a's decision for the switch",
        lambda: demo.decisions("job-a")[0]["trigger"].startswith("switch:"),
    )
    d = demo.decisions("job-a")[0]
    moved = ", ".join(f"{m['node']}/rank {m['rank']}" for m in d["plan"]["failed_over"])
    demo.say(f"job-a: {d['action']}, moving {moved}")
    n3 = [
        c
        for c in demo.http.get("/v1/jobs/job-a/commands").json()["commands"]
        if c["node"] == "n3" and c["kind"] == "failover"
    ]
    if n3:
        demo.say(f"n3 told to move rank(s) {n3[0]['ranks']} before it reported any fault")
    sim = demo.sims["job-a"]
    # The channel plan: DCR (REBALANCE) or R²CCL balance with its weights (BALANCE).
    (op, epoch, kind, channels), weights = _applied_as_one(
        demo, "the new channel plan", (CommandKind.REBALANCE, CommandKind.BALANCE), seen
    )
    if kind == CommandKind.BALANCE:
        shares = sorted({round(w, 4) for w in weights})
        demo.say(
            f"all {len(sim.ranks)} ranks of job-a balanced their channels at ops_done {op} "
            f"(epoch {epoch}), as one: channel weights {shares}; a CCL without weights "
            f"disabled channels {list(channels)} instead"
        )
    else:
        demo.say(
            f"all {len(sim.ranks)} ranks of job-a disabled channels {list(channels)} at "
            f"ops_done {op} (epoch {epoch}), as one"
        )


def _act_maintenance(demo: Demo) -> None:
    sim = demo.sims["job-a"]
    seen = _newest_epoch(demo)
    # Its lead time begins a second from now, so the ranks have the whole lead time to move
    # before it opens, even on a machine busy enough that a decision takes seconds.
    start = datetime.now(UTC) + timedelta(seconds=SERVICE["maintenance_lead_s"] + 1.0)
    demo.say(f"act 4: rail2-a gets new firmware, planned: down for 1 s from {start:%H:%M:%S}")
    history = demo.decisions("job-a")
    before = len(history)
    already = {m["rank"] for m in history[0]["plan"].get("failed_over", [])} if history else set()
    body = {
        "target": {"switch": "rail2-a"},
        "start_at": start.isoformat(),
        "duration_s": 1,
        "reason": "firmware upgrade",
    }
    r = demo.http.post("/v1/maintenance", json=body)
    if r.status_code != 201:
        raise DemoError(f"scheduling the maintenance failed: {r.status_code} {r.text}")
    window = r.json()
    demo.say(
        f"maintenance {window['id']} scheduled; jobs it would restart: "
        f"{', '.join(window['would_restart']) or 'none'}"
    )
    d = demo.wait_decision("job-a", "failover", before)
    ahead = (start - datetime.fromisoformat(d["created_at"])).total_seconds()
    moved = ", ".join(
        f"{m['node']}/rank {m['rank']}"
        for m in d["plan"]["failed_over"]
        if m["rank"] not in already
    )
    demo.say(f"job-a: failover {ahead:.1f} s before the window opens, moving {moved}")
    d = demo.wait_decision("job-a", "failback", before + 1)
    demo.say(f"job-a: {d['action']} after the window and the damping ({d['reason']})")

    (op, epoch, _kind, channels), _ = _applied_as_one(
        demo, "the fail-back", (CommandKind.FAILBACK,), seen
    )
    demo.say(
        f"all {len(sim.ranks)} ranks of job-a back on rail2-a at ops_done {op} (epoch {epoch}), "
        f"as one; channels {list(channels)} stay off while rail1-a is down"
    )


def _summary(demo: Demo) -> Table:
    table, total = summary([(j, d) for j in JOBS for d in demo.decisions(j)])
    shown = demo.http.get("/v1/status").json()["saved_gpu_seconds"]
    if shown != total:  # one definition: the page must say what the summary says
        raise DemoError(f"the status page shows {shown} GPU-s saved, the summary {total}")
    return table


def summary(rows: list[tuple[str, dict[str, Any]]]) -> tuple[Table, float]:
    """The decisions table and the GPU-seconds they saved, as the service counts them.

    Each row is (job id, a decision as GET /v1/jobs/{id}/decisions returns it); the
    total is the one definition's (engine.decision.saved_gpu_s, summed exactly), so it
    is the status page's and /metrics' number for the same decisions.
    """
    table = Table(title="Decisions", show_lines=True, expand=True)
    for col in ("job", "trigger", "action", "saved GPU-h", "reason"):
        table.add_column(col, overflow="fold")
    ordered = sorted(rows, key=lambda row: (row[1]["created_at"], row[1]["decision_id"]))
    for job_id, d in ordered:
        saved = f"{d['saved_gpu_s'] / 3600:.2f}"
        table.add_row(job_id, d["trigger"], d["action"], saved, d["reason"])
    total = total_saved_gpu_s(d["saved_gpu_s"] for _, d in ordered)
    table.caption = f"saved vs. always restarting: {gpu_hours(total)}"
    return table, total


def run_demo(keep_running: bool = False, console: Console | None = None) -> int:
    console = console or Console()
    # The agents and plugins log every reconnect and refused ack; the script
    # narrates what matters, so keep their chatter to real errors.
    for name in ("agent", "railover.native_plugin"):
        logging.getLogger(name).setLevel(logging.ERROR)
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="railover-demo-") as tmp,
        _cluster(console, Path(tmp)) as demo,
    ):
        console.rule("[bold]Railover demo")
        console.print(f"service and status page: {demo.url}/   (API docs: {demo.url}/docs)")
        console.print("4 nodes x 8 GPUs x 8 RNICs on 8 rails; agents read their sysfs trees")
        demo.register("job-a", checkpoint_age_s=3000)
        demo.register("job-b", checkpoint_age_s=300, comm_share=0.9)
        for job_id in JOBS:
            demo.start_job(job_id)
        demo.wait(
            "both jobs to run and report progress",
            lambda: all(s.ops_done > 100 for s in demo.sims.values()),
        )
        demo.say("job-a (k by default) and job-b (90 % communication) are training")
        stop = threading.Event()
        with Live(demo.render(), console=console, refresh_per_second=2) as live:

            def refresh() -> None:
                while not stop.wait(0.5):
                    live.update(demo.render())

            painter = threading.Thread(target=refresh, daemon=True)
            painter.start()
            try:
                for act in (_act_flap, _act_rnic_death, _act_switch, _act_maintenance):
                    act(demo)
            finally:
                stop.set()
                painter.join(timeout=5)
                live.update(demo.render())
        console.print()
        console.rule("What happened")
        console.print("\n".join(demo.log), highlight=False)
        console.print(_summary(demo))
        console.print(f"played in {time.monotonic() - started:.0f} s")
        if keep_running:
            console.print(f"left running at {demo.url}/ ; Ctrl-C to stop")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    return 0


def main(argv: list[str] | None = None) -> int:
    """`make demo`: check the plugin is built, then play the script."""
    parser = argparse.ArgumentParser(
        prog="python -m railover_testing.demo",
        description="Start the service on SQLite, inject faults into a small cluster and show "
        "the decisions.",
    )
    parser.add_argument(
        "--keep-running", action="store_true", help="Leave the service up afterwards"
    )
    args = parser.parse_args(argv)
    # Said before a cluster is built, not as a traceback from the first simulated rank.
    if not library_path().is_file():
        explain(
            f"the native plugin library {library_path()} is not built",
            "make -C native_plugin (or `make demo`, which builds it)",
            program="make demo",
        )
        return 2
    return run_demo(keep_running=args.keep_running)


if __name__ == "__main__":
    sys.exit(main())
