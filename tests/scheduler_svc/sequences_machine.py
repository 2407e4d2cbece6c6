"""Issue 28's model-based test: random sequences over the HTTP API, invariants after each step.

`SequencesMachine` drives one real service (a fresh, empty store each sequence) on a manual
clock, as a cluster and its fleet manager would: port reports on the RNICs of four nodes
whose same-named RNICs share a rail leaf (hgx_node: mlx5_r is cabled to rail<r>-leaf), on
time, duplicated, late (observed before the newest report of the port) or ahead of the
service's clock within the allowed skew; CQE bursts; a leaf's nodes failing together and
coming back one by one; checkpoints of the current, an ended and the next incarnation;
the fleet manager executing a restart on the same nodes or on spares (or never); agents
cut off past the acknowledgement deadlines and back; acks applied, too_late and failed;
maintenance windows; a second job on the other GPUs of the first one's nodes; the clock
moving past damping, quiet periods and deadlines.

After every step (once the coordinator has swept what the clock made due) it checks what
the README's "What the service decides over time" promises, as the `check_*` methods it
inherits from sequences_invariants.py:

1. no live command and no `/paths` row puts a rank on a port whose newest report (by
   `observed_at`, as the model tracks it) is DOWN;
2. no live command addresses a rank the service keeps elsewhere;
3. each (job, communicator, epoch) names one plan, and a registered communicator's switch
   point exactly its members;
4. a step that brings no new evidence (a duplicate, a report older than the port's
   newest, an ended incarnation's checkpoint, a refused claim, a poll) makes no decision
   and no command, and a job restarts at most once per fault evidence per placement;
5. no command reaches another job's processes: it names its job and the job's current
   incarnation, and only ranks the job has on the command's node;
6. the GET views agree with the commands issued (the incarnation, the job's mode, each
   rank's active path);
7. no request is answered 5xx and no coordinator sweep fails;
8. what reconcile says on the service's caches (each job's placement and index, each
   node's plans) is what it says on a fresh read of the store.

The test (test_sequences_model.py) runs a few sequences in `make test` on both stores;
benchmarks/bench_sequences_model.py runs thousands and times the steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import datetime, timedelta
from typing import Any, ClassVar

import httpx
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from sqlalchemy import Engine, text

from railover_testing.local import ManualClock
from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.models import Base
from tests.scheduler_svc.helpers import register_nodes, service_factory, sweep
from tests.scheduler_svc.sequences import (
    SERVICE,
    SWITCH_KINDS,
    T0,
    ack,
    commands,
    decisions,
    ev,
    faults,
    get,
    job,
    paths,
    poll,
    post,
)
from tests.scheduler_svc.sequences_invariants import SequencesInvariants

# The settings of every sequence: the sequence tests' own, with the deadlines short enough
# that a few clock moves pass them (an agent cut off is unreachable after 3 x 30 s).
MODEL_SERVICE: dict[str, Any] = SERVICE | {
    "command_ack_timeout_s": 30,
    "command_max_attempts": 3,
    "maintenance_lead_s": 60,
    "observed_at_future_skew_s": 120,
}
SKEW_S = MODEL_SERVICE["observed_at_future_skew_s"]

NODES = ("n0", "n1", "n2", "n3")  # mlx5_r of each is on rail<r>-leaf: one leaf per rail
# GPU 2 and 3 share a PCIe switch: mlx5_2 is the primary of one and the backup of the other,
# so both down leaves them no path. mlx5_5 is GPU 5's primary (backup mlx5_4), mlx5_6 that
# of the second job's GPU 6.
DEVICES = ("mlx5_2", "mlx5_3", "mlx5_5", "mlx5_6")
A_GPUS = range(6)  # job "A": GPUs 0-5 of each node it is placed on
B_GPUS = range(6, 8)  # job "B": GPUs 6-7 of n0 and n1
PLACEMENTS = (("n0", "n1"), ("n2", "n1"), ("n0", "n3"), ("n2", "n3"))  # same nodes, spares
COMM_A = 77
ADVANCES = (1, 5, 31, 61, 121, 301, 1800)
LATE_S = 180  # how far before the service's clock a late report may be observed
START_S = LATE_S + 60  # the clock when the first job is posted, from T0

Connect = Callable[[], AbstractContextManager[tuple[httpx.Client, ManualClock, Settings]]]


def rank_body(job_id: str, nodes: tuple[str, ...], gpus: range) -> list[dict[str, Any]]:
    return [
        {"rank": i * len(gpus) + k, "node": n, "gpu": g}
        for i, n in enumerate(nodes)
        for k, g in enumerate(gpus)
    ]


def job_post(
    job_id: str,
    nodes: tuple[str, ...],
    gpus: range,
    last_checkpoint_at: datetime,
    communicators: list[dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "ranks": rank_body(job_id, nodes, gpus),
        "checkpoint_interval_s": 3600,
        "reload_s": 600,
        "detect_s": 0,
        "timeout_s": 30,
        "last_checkpoint_at": last_checkpoint_at.isoformat(),
        "slowdown_k": 1.5,
        "communicators": communicators,
        **extra,
    }


# --- a fresh store for each sequence ------------------------------------------------------

_ENGINES: dict[str, Engine] = {}


def store(db_url: str) -> Engine:
    """This process's own engine on the sequences' store (one per store, kept)."""
    engine = _ENGINES.get(db_url)
    if engine is None:
        engine = _ENGINES[db_url] = make_engine(db_url)
    return engine


def empty_store(db_url: str) -> None:
    """Delete every row (the schema stays): each sequence starts from an empty store."""
    engine = store(db_url)
    tables = Base.metadata.sorted_tables
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            names = ", ".join(t.name for t in tables)
            conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
        else:
            for t in reversed(tables):
                conn.execute(t.delete())


def connect_to(db_url: str, **settings: Any) -> Connect:
    """Each call: the store emptied and a service on it, on a manual clock at T0."""

    @contextmanager
    def connect() -> Iterator[tuple[httpx.Client, ManualClock, Settings]]:
        empty_store(db_url)
        clock = ManualClock(T0)
        with service_factory(db_url, **(MODEL_SERVICE | settings)) as start:
            running = start(clock=clock)
            yield running.http, clock, running.settings

    return connect


def swept() -> dict[str, float]:
    """The coordinator's sweeps so far, by outcome: railover_coordinator_sweeps_total, read
    in this process (the service runs in it) rather than over /metrics, whose whole text
    takes 25 ms to render; the machine checks it after every step."""
    return {o: metrics.SWEEPS.labels(outcome=o)._value.get() for o in ("ok", "error")}


def settle(http: httpx.Client, errors: float = 0.0) -> None:
    """sequences.settle: a whole coordinator sweep run here, at once; and invariant 7 of
    the sweeps the coordinator's own thread runs beside the steps: no more have failed
    than `errors`."""
    sweep(http)
    assert swept()["error"] == errors, "invariant 7: a coordinator sweep failed"


def no_5xx(response: httpx.Response) -> None:
    """Invariant 7, on every answer the machine gets."""
    if response.status_code >= 500:
        response.read()
        raise AssertionError(
            f"{response.request.method} {response.request.url.path}: "
            f"{response.status_code} {response.text[:2000]}"
        )


class SequencesMachine(SequencesInvariants, RuleBasedStateMachine):
    """See the module's docstring. A subclass sets `connect`; `step_s`, when a list,
    collects each step's wall time (the rule and the checks after it)."""

    connect: ClassVar[Connect]
    step_s: ClassVar[list[float] | None] = None

    events = Bundle("events")

    def __init__(self) -> None:
        super().__init__()
        self._stack = ExitStack()
        self.http, self.clock, self.settings = self._stack.enter_context(type(self).connect())
        self.sessions = make_sessionmaker(store(self.settings.db_url))
        self.http.event_hooks["response"].append(no_5xx)
        self.sweep_errors = swept()["error"]
        # Model state: each port's newest report (observed_at, up?) ...
        self.level: dict[tuple[str, str], tuple[datetime, bool]] = {
            (n, d): (T0, True) for n in NODES for d in DEVICES
        }
        # ... each job's placement (rank -> node), incarnation and communicator members.
        self.placement: dict[str, dict[int, str]] = {}
        self.incarnation: dict[str, int] = {}
        self.members: dict[str, dict[tuple[int, int], set[int]]] = {}  # (inc, comm) -> ranks
        self.comm_a: list[dict[str, Any]] = []
        self.partitioned: set[str] = set()
        self.handed: dict[int, dict[str, Any]] = {}  # delivered, not acked by the model
        self.windows: list[int] = []
        # What the last check saw, and what the next one compares with.
        self.mode: dict[str, str] = {}
        self.counts: dict[str, tuple[int, int]] = {}
        self.no_evidence = False
        self.restart_at: dict[str, datetime] = {}
        self.restarts: dict[str, dict[str, tuple[frozenset[str], frozenset[str]]]] = {}
        self.last_checkpoint: datetime = T0
        self._t = time.perf_counter()

    def teardown(self) -> None:
        self.http.close()
        self._stack.close()

    # --- helpers ---------------------------------------------------------------------

    def now(self) -> datetime:
        return self.clock()

    def jobs(self) -> list[str]:
        return sorted(self.placement)

    def nodes_of(self, job_id: str) -> set[str]:
        return set(self.placement[job_id].values())

    def down(self) -> set[tuple[str, str]]:
        return {p for p, (_, up) in self.level.items() if not up}

    def report(self, node: str, device: str, up: bool, at: datetime) -> dict[str, Any]:
        """Post one port report; the model's level follows it if it is the newest."""
        body = ev(node, "port_up" if up else "port_down", at, device=device)
        newest, _ = self.level[(node, device)]
        out = post(self.http, body)
        assert out["accepted"] == 1, out
        if at > newest:
            self.level[(node, device)] = (at, up)
        else:
            assert out["faults_opened"] == 0, (body, out)
        return body

    # --- the cluster -----------------------------------------------------------------

    @initialize(
        with_comm=st.booleans(),
        elapsed_s=st.sampled_from([100, 3000]),
    )
    def start(self, with_comm: bool, elapsed_s: int) -> None:
        register_nodes(self.http, list(NODES))
        # Every report the machine makes is observed after the registration (T0): a late
        # one is late against the port's newest report, not against its registration.
        self.clock.advance(START_S)
        self.comm_a = [{"comm_id": COMM_A, "channels": 16}] if with_comm else []
        self.last_checkpoint = self.now() - timedelta(seconds=elapsed_s)
        self.post_a(PLACEMENTS[0], expect_incarnation=1)

    def post_a(self, nodes: tuple[str, ...], expect_incarnation: int) -> None:
        body = job_post("A", nodes, A_GPUS, self.last_checkpoint, self.comm_a)
        r = self.http.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        assert r.json()["incarnation"] == expect_incarnation, r.json()
        self.placement["A"] = {x["rank"]: x["node"] for x in body["ranks"]}
        self.incarnation["A"] = expect_incarnation
        members = self.members.setdefault("A", {})
        for c in self.comm_a:
            members[(expect_incarnation, c["comm_id"])] = set(self.placement["A"])

    @rule(
        target=events,
        node=st.sampled_from(NODES),
        device=st.sampled_from(DEVICES),
        up=st.booleans(),
        offset_s=st.one_of(
            st.just(0), st.integers(-LATE_S, -1), st.integers(1, SKEW_S - 20)
        ),  # on time, late, ahead within the skew
    )
    def port_report(self, node: str, device: str, up: bool, offset_s: int) -> Any:
        at = self.now() + timedelta(seconds=offset_s)
        newest, _ = self.level[(node, device)]
        if at == newest:  # two reports of one port observed at once: no order to test
            at += timedelta(milliseconds=1)
        self.no_evidence = at < newest
        return self.report(node, device, up, at)

    @precondition(lambda self: bool(self.down()))
    @rule(data=st.data())
    def one_comes_back(self, data: st.DataObject) -> None:
        """One of the ports down comes back now (a leaf's nodes recover one by one)."""
        node, device = data.draw(st.sampled_from(sorted(self.down())))
        self.report(
            node,
            device,
            True,
            max(self.now(), self.level[(node, device)][0]) + timedelta(milliseconds=1),
        )

    @rule(device=st.sampled_from(DEVICES), nodes=st.permutations(NODES), n=st.integers(3, 4))
    def leaf_fails(self, device: str, nodes: list[str], n: int) -> None:
        """n nodes report the device's port down within a second: its leaf failed."""
        now = self.now()
        for i, node in enumerate(nodes[:n]):
            at = max(
                now + timedelta(seconds=i * 0.3),
                self.level[(node, device)][0] + timedelta(milliseconds=1),
            )
            self.report(node, device, False, at)

    @rule(
        target=events,
        node=st.sampled_from(NODES),
        device=st.sampled_from(DEVICES),
        n=st.integers(1, 4),
    )
    def cqe_burst(self, node: str, device: str, n: int) -> Any:
        now = self.now()
        bodies = [
            ev(node, "cqe_error", now - timedelta(seconds=0.1 * i), device=device, wc_status=12)
            for i in range(n)
        ]
        out = post(self.http, *bodies)
        assert out["accepted"] == n, out
        return bodies[0]

    @rule(body=events)
    def duplicate(self, body: dict[str, Any]) -> None:
        """An agent re-sends a report it already sent (same event id): nothing happens."""
        out = post(self.http, body)
        assert (out["accepted"], out["duplicates"]) == (0, 1), out
        self.no_evidence = True

    # --- the jobs and the fleet manager ------------------------------------------------

    def checkpoint(self, job_id: str, at: datetime, **extra: Any) -> None:
        r = self.http.post(f"/v1/jobs/{job_id}/checkpoints", json={"at": at.isoformat(), **extra})
        assert r.status_code == 201, r.text

    @precondition(lambda self: self.mode.get("A") != "restarting")
    @rule(kind=st.sampled_from(["full", "flowcheck"]), named=st.booleans())
    def checkpoint_current(self, kind: str, named: bool) -> None:
        extra = {"incarnation": self.incarnation["A"]} if named else {}
        self.last_checkpoint = self.now()
        self.checkpoint("A", self.now(), kind=kind, **extra)

    @precondition(
        lambda self: self.mode.get("A") == "restarting" or self.incarnation.get("A", 1) > 1
    )
    @rule(named=st.booleans())
    def checkpoint_of_an_ended_incarnation(self, named: bool) -> None:
        """A late checkpoint of an incarnation that has ended changes nothing."""
        if self.mode["A"] == "restarting":
            at = self.restart_at["A"] - timedelta(seconds=1)
            extra = {"incarnation": self.incarnation["A"]} if named else {}
        else:
            at = self.now()
            extra = {"incarnation": self.incarnation["A"] - 1}
        self.checkpoint("A", at, **extra)
        self.no_evidence = True

    @precondition(lambda self: self.mode.get("A") == "restarting")
    @rule()
    def checkpoint_of_the_next_incarnation(self) -> None:
        """The restarted processes' first checkpoint names their incarnation: it starts."""
        self.last_checkpoint = self.now()
        self.checkpoint("A", self.now(), incarnation=self.incarnation["A"] + 1)
        self.incarnation["A"] += 1
        members = self.members["A"]
        for c in self.comm_a:
            members[(self.incarnation["A"], c["comm_id"])] = set(self.placement["A"])

    @precondition(lambda self: self.mode.get("A") == "restarting")
    @rule(nodes=st.sampled_from(PLACEMENTS))
    def fleet_restarts(self, nodes: tuple[str, ...]) -> None:
        """The fleet manager executes the restart: the job posted again (same nodes or
        spares), from its newest checkpoint."""
        self.post_a(nodes, expect_incarnation=self.incarnation["A"] + 1)
        self.handed = {k: c for k, c in self.handed.items() if c["job_id"] != "A"}

    @precondition(lambda self: "B" not in self.placement)
    @rule(with_comm=st.booleans())
    def second_job(self, with_comm: bool) -> None:
        """Job B on the other GPUs of n0 and n1 (with no communicator: rank numbers that
        name a process of A too)."""
        comms = [{"comm_id": 78, "channels": 4}] if with_comm else []
        body = job_post("B", ("n0", "n1"), B_GPUS, self.now() - timedelta(seconds=3000), comms)
        r = self.http.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        self.placement["B"] = {x["rank"]: x["node"] for x in body["ranks"]}
        self.incarnation["B"] = 1
        self.members["B"] = {(1, 78): set(self.placement["B"])} if with_comm else {}

    @precondition(lambda self: self.mode.get("A") != "restarting")
    @rule(gpu=st.sampled_from(list(A_GPUS)), second=st.booleans())
    def claim_held_gpus(self, gpu: int, second: bool) -> None:
        """A job posted on a GPU that A (running) holds is refused, naming A."""
        nodes = sorted(self.nodes_of("A"))
        node = nodes[1] if second else nodes[0]
        body = job_post("C", (node,), range(gpu, gpu + 1), self.now(), [])
        r = self.http.post("/v1/jobs", json=body)
        assert r.status_code == 409, r.text
        assert "'A'" in r.json()["detail"], r.text
        self.no_evidence = True

    # --- the agents ----------------------------------------------------------------------

    @rule(node=st.sampled_from(NODES))
    def agent_polls(self, node: str) -> None:
        if node in self.partitioned:
            return
        for c in poll(self.http, node):
            self.check_handed(node, c)
            self.handed[c["command_id"]] = c

    @precondition(lambda self: bool(self.handed))
    @rule(data=st.data(), status=st.sampled_from(["applied", "applied", "too_late", "failed"]))
    def agent_acks(self, data: st.DataObject, status: str) -> None:
        reachable = sorted(k for k, c in self.handed.items() if c["node"] not in self.partitioned)
        if not reachable:
            return
        cmd = self.handed.pop(reachable[data.draw(st.integers(0, len(reachable) - 1))])
        extra: dict[str, Any] = {}
        if status == "too_late":
            if cmd["kind"] not in SWITCH_KINDS:
                status = "applied"
            else:
                extra["ops_done"] = cmd["ops_done"] + 5
        if status == "failed":
            extra["detail"] = "the model's agent refuses it"
        ack(self.http, cmd, status, **extra)

    @rule(node=st.sampled_from(NODES))
    def partition(self, node: str) -> None:
        """The node's agent is cut off: it polls and acks nothing until it returns."""
        self.partitioned.add(node)

    @precondition(lambda self: bool(self.partitioned))
    @rule(data=st.data())
    def partition_heals(self, data: st.DataObject) -> None:
        """The agent is back: it polls and applies what it is handed."""
        node = data.draw(st.sampled_from(sorted(self.partitioned)))
        self.partitioned.discard(node)
        for c in poll(self.http, node):
            self.check_handed(node, c)
            ack(self.http, c, "applied")
        for k in [k for k, c in self.handed.items() if c["node"] == node]:
            ack(self.http, self.handed.pop(k), "applied")

    # --- operators and time ----------------------------------------------------------------

    @rule(
        node=st.sampled_from(NODES),
        device=st.sampled_from(DEVICES),
        switch=st.booleans(),
        start_s=st.sampled_from([0, 30, 120]),
        duration_s=st.sampled_from([60, 600]),
    )
    def maintenance(
        self, node: str, device: str, switch: bool, start_s: int, duration_s: int
    ) -> None:
        target = (
            {"switch": f"rail{device.removeprefix('mlx5_')}-leaf"}
            if switch
            else {"node": node, "device": device}
        )
        body = {
            "target": target,
            "start_at": (self.now() + timedelta(seconds=start_s)).isoformat(),
            "duration_s": duration_s,
            "reason": "the model's window",
        }
        r = self.http.post("/v1/maintenance", json=body)
        assert r.status_code == 201, r.text
        self.windows.append(r.json()["id"])

    @precondition(lambda self: bool(self.windows))
    @rule(data=st.data())
    def cancel_maintenance(self, data: st.DataObject) -> None:
        window_id = data.draw(st.sampled_from(self.windows))
        self.windows.remove(window_id)
        r = self.http.delete(f"/v1/maintenance/{window_id}")
        assert r.status_code in (200, 409), r.text  # 409: it had ended by itself

    @rule(seconds=st.sampled_from(ADVANCES))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule()
    def wait_for_the_sweeps(self) -> None:
        settle(self.http, self.sweep_errors)
        self.no_evidence = True

    # --- the invariants ----------------------------------------------------------------------

    @invariant()
    def check(self) -> None:
        settle(self.http, self.sweep_errors)
        seen = {j: self.read(j) for j in self.jobs()}
        open_faults = faults(self.http)
        fabric = get(self.http, "/v1/fabric")
        for j, (jb, ds, cs, ps) in seen.items():
            counts = (len(ds), len(cs))
            if self.no_evidence and j in self.counts:
                assert counts == self.counts[j], (
                    f"invariant 4: a step with no new evidence changed job {j}'s decisions or "
                    f"commands: {self.counts[j]} -> {counts}; newest: {ds[:2]}"
                )
            self.counts[j] = counts
            self.mode[j] = jb["mode"]
            self.check_views(j, jb, ds, cs, ps)
            self.check_dead_hardware(j, ds, cs, ps)
            self.check_elsewhere(j, jb, ds, cs, ps)
            self.check_epochs(j, cs)
            self.check_whose(j, cs)
            self.check_restarts(j, ds, open_faults, fabric)
            self.check_fresh_read(j)
        self.no_evidence = False
        if self.step_s is not None:
            t = time.perf_counter()
            self.step_s.append(t - self._t)
            self._t = t

    def read(
        self, j: str
    ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        return (
            job(self.http, j),
            decisions(self.http, j),
            commands(self.http, j),
            paths(self.http, j),
        )
