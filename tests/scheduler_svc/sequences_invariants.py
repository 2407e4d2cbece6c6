"""The invariants of issue 28's model-based test (sequences_machine.py), as `check_*` methods.

`SequencesMachine` inherits them from `SequencesInvariants` and calls them after every
step, once the coordinator has swept what the clock made due (its `check` invariant reads
each job's views and hands them over). The numbers are those of the machine's docstring,
after the README's "What the service decides over time".
"""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from railover_testing.local import ManualClock
from scheduler_svc.config import Settings
from scheduler_svc.engine import reconcile
from scheduler_svc.engine.state import Reconciled
from scheduler_svc.services import fabric, reconciler
from scheduler_svc.store import models as m
from scheduler_svc.store.jobs import JobRepo
from tests.scheduler_svc.sequences import LIVE, SWITCH_KINDS

RESTARTS = ("restart", "restart_scaled")


class SequencesInvariants:
    """The `check_*` methods of `SequencesMachine`, over the model state it keeps."""

    # The model state (SequencesMachine.__init__ sets it; see there).
    placement: dict[str, dict[int, str]]
    incarnation: dict[str, int]
    members: dict[str, dict[tuple[int, int], set[int]]]
    windows: list[int]
    restart_at: dict[str, datetime]
    restarts: dict[str, dict[str, tuple[frozenset[str], frozenset[str]]]]
    # The service's settings and clock, and sessions on its store of this process's own.
    settings: Settings
    clock: ManualClock
    sessions: sessionmaker[Session]

    if TYPE_CHECKING:  # SequencesMachine's, from the model state

        def down(self) -> set[tuple[str, str]]: ...

        def nodes_of(self, job_id: str) -> set[str]: ...

    @staticmethod
    def rows(ps: dict[str, Any]) -> dict[int, dict[str, Any]]:
        return {r["rank"]: r for r in ps["ranks"]}

    @staticmethod
    def port(node: str, path: str | None) -> tuple[str, str] | None:
        return None if path is None else (node, path.split("/")[0])

    @staticmethod
    def returning(c: dict[str, Any], ds: list[dict[str, Any]]) -> set[int]:
        """The ranks a FAILBACK takes back to their primary: those its fail-back decision
        returns; of a failover's switch point (its channel plan), those it does not move."""
        by_id = {d["decision_id"]: d for d in ds}
        d = by_id.get(c["decision_id"])
        if d is None:
            return set(c["ranks"])
        if "returning" in d["plan"]:
            return {r["rank"] for r in d["plan"]["returning"]} & set(c["ranks"])
        return set(c["ranks"]) - {m["rank"] for m in d["plan"].get("failed_over", [])}

    @staticmethod
    def in_order(cs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Commands in the order they were decided: a communicator's epochs count it (a
        retry keeps the epoch of what it re-issues)."""
        return sorted(cs, key=lambda c: (c["comm_id"], c["epoch"], c["command_id"]))

    def check_dead_hardware(
        self, j: str, ds: list[dict[str, Any]], cs: list[dict[str, Any]], ps: dict[str, Any]
    ) -> None:
        """1: nothing puts a rank on a port whose newest report is DOWN, nor keeps it on a
        failed backup while its primary works. A rank whose primary has failed too has no path
        to lose: a FAILOVER on its way to it moves it from one dead port to the other."""
        down = self.down()
        rows = self.rows(ps)
        moved = set(ps["failed_over_ranks"])
        for r, row in rows.items():
            assert self.port(row["node"], row["active"]) not in down, (
                f"invariant 1: /paths of {j} has rank {r} on {row['node']}/{row['active']}, "
                "whose newest report is DOWN"
            )
            assert r not in moved or row["backup_ok"] or not row["primary_ok"], (
                f"invariant 1: /paths of {j} keeps rank {r} on its failed backup "
                f"{row['node']}/{row['backup']} while its primary {row['primary']} works"
            )
        for c in cs:
            if c["state"] not in LIVE:
                continue
            if c["kind"] == "failover":
                for r in c["ranks"]:
                    to = self.port(c["node"], rows[r]["backup"]) if r in rows else None
                    assert to not in down or (r in rows and not rows[r]["primary_ok"]), (
                        f"invariant 1: live FAILOVER {c['command_id']} of {j} moves rank {r} "
                        f"onto {to}, whose newest report is DOWN"
                    )
            if c["kind"] == "failback":
                back = self.returning(c, ds) if c["disabled_channels"] else set(c["ranks"])
                for r in back:
                    to = self.port(c["node"], rows[r]["primary"]) if r in rows else None
                    assert to not in down, (
                        f"invariant 1: live FAILBACK {c['command_id']} of {j} returns rank {r} "
                        f"to {to}, whose newest report is DOWN"
                    )

    def check_elsewhere(
        self,
        j: str,
        jb: dict[str, Any],
        ds: list[dict[str, Any]],
        cs: list[dict[str, Any]],
        ps: dict[str, Any],
    ) -> None:
        """2: a live command moves a rank only to where the service keeps it."""
        live = [c for c in cs if c["state"] in LIVE]
        if jb["mode"] == "restarting":
            kept = [c for c in live if c["kind"] != "abort"]
            assert kept == [], (
                f"invariant 2: {j} restarts, yet commands that move ranks are live: {kept}"
            )
            return
        rows = self.rows(ps)
        newest: dict[int, tuple[dict[str, Any], str]] = {}  # rank -> its newest move, where to
        returns: dict[int, dict[str, Any]] = {}  # rank -> a live FAILBACK returning it
        for c in self.in_order(cs):
            if c["state"] == "superseded" or c["incarnation"] != self.incarnation[j]:
                continue
            if c["kind"] == "failover":
                for r in c["ranks"]:
                    newest[r] = (c, "backup")
                    back = returns.pop(r, None)
                    assert back is None, (
                        f"invariant 2: live FAILBACK {back['command_id']} of {j} (epoch "
                        f"{back['epoch']}) would return rank {r} to its primary, but the newer "
                        f"FAILOVER {c['command_id']} (epoch {c['epoch']}) moves it"
                    )
            elif c["kind"] == "failback" and c["state"] != "failed":
                for r in self.returning(c, ds):
                    newest[r] = (c, "primary")
                    if c["state"] in LIVE:
                        returns[r] = c
        moved = set(ps["failed_over_ranks"])
        for r, (c, to) in newest.items():
            if c["state"] not in LIVE or r not in rows:
                continue
            # A rank with no path left is kept where it was told: /paths shows which side,
            # and no active path.
            side = "backup" if r in moved else "primary"
            active = rows[r]["active"]
            works = rows[r]["backup_ok" if side == "backup" else "primary_ok"]
            assert side == to and active == (rows[r][to] if works else None), (
                f"invariant 2: live {c['kind'].upper()} {c['command_id']} of {j} takes rank "
                f"{r} to its {to} {rows[r][to]}, but the service keeps it on its {side} "
                f"({active})"
            )

    def check_epochs(self, j: str, cs: list[dict[str, Any]]) -> None:
        """3: (job, communicator, epoch) names one plan; a switch point, every member."""
        plans: dict[tuple[int, int], set[tuple[Any, ...]]] = {}
        ranks: dict[tuple[int, int], set[int]] = {}
        for c in cs:
            key = (c["comm_id"], c["epoch"])
            plan = (
                c["kind"],
                c["incarnation"],
                c["ops_done"],
                tuple(c["disabled_channels"]),
                tuple(c["channel_weights"]),
                c["split_ratio"],
            )
            plans.setdefault(key, set()).add(plan)
            ranks.setdefault(key, set()).update(c["ranks"])
        for key, ps in plans.items():
            assert len(ps) == 1, (
                f"invariant 3: {j}'s (comm, epoch) {key} names {len(ps)} plans: {ps}"
            )
            ((kind, inc, *_),) = ps
            members = self.members.get(j, {}).get((inc, key[0]))
            if kind in SWITCH_KINDS and members is not None:
                assert ranks[key] == members, (
                    f"invariant 3: {j}'s {kind} switch point {key} names ranks "
                    f"{sorted(ranks[key])}, not the communicator's {sorted(members)}"
                )

    def check_whose(self, j: str, cs: list[dict[str, Any]]) -> None:
        """5: a live command is for the job's current incarnation and its own ranks."""
        for c in cs:
            if c["state"] in LIVE:
                self.check_for(j, c["node"], c)

    def check_for(self, j: str, node: str, c: dict[str, Any]) -> None:
        where = self.placement[j]
        assert c["job_id"] == j and c["node"] == node, f"invariant 5: {c} is not {j}'s on {node}"
        assert c["incarnation"] == self.incarnation[j], (
            f"invariant 5: live {c['kind'].upper()} {c['command_id']} is for {j}'s incarnation "
            f"{c['incarnation']}; it runs incarnation {self.incarnation[j]}"
        )
        wrong = [r for r in c["ranks"] if where.get(r) != node]
        assert not wrong, (
            f"invariant 5: {c['kind'].upper()} {c['command_id']} of {j} on {node} names ranks "
            f"{wrong}, which {j} does not have there"
        )

    def check_handed(self, node: str, c: dict[str, Any]) -> None:
        """5, as the agent is handed it: whom it is for, and which ranks others hold there."""
        j = c["job_id"]
        assert j in self.placement, f"invariant 5: {node} was handed a command of {j!r}: {c}"
        self.check_for(j, node, c)
        others = sorted(
            r
            for o, where in self.placement.items()
            if o != j
            for r, n in where.items()
            if n == node
        )
        assert c["other_jobs_ranks"] == others, (
            f"invariant 5: {node} was handed {c['command_id']} saying other jobs hold ranks "
            f"{c['other_jobs_ranks']} there; they hold {others}"
        )

    def check_views(
        self,
        j: str,
        jb: dict[str, Any],
        ds: list[dict[str, Any]],
        cs: list[dict[str, Any]],
        ps: dict[str, Any],
    ) -> None:
        """6: the job, its decisions, its commands and /paths tell one story."""
        assert jb["incarnation"] == self.incarnation[j], (
            f"invariant 6: {j} is at incarnation {jb['incarnation']}; the fleet started "
            f"{self.incarnation[j]}"
        )
        assert sorted((r["rank"], r["node"]) for r in jb["ranks"]) == sorted(
            self.placement[j].items()
        ), f"invariant 6: {j}'s ranks are not where it was posted"
        if jb["mode"] == "restarting":
            assert ds and ds[0]["action"] in RESTARTS, (
                f"invariant 6: {j} restarts, but its newest decision is {ds[:1]}"
            )
            told = {
                c["node"]
                for c in cs
                if c["kind"] == "abort"
                and c["decision_id"] == ds[0]["decision_id"]
                and c["incarnation"] == self.incarnation[j]
            }
            assert told == self.nodes_of(j), (
                f"invariant 6: {j} restarts (decision {ds[0]['decision_id']}), but incarnation "
                f"{self.incarnation[j]} was sent ABORT on {sorted(told)} of "
                f"{sorted(self.nodes_of(j))}"
            )
            on = [(r["rank"], r["active"]) for r in ps["ranks"] if r["active"] is not None]
            assert not on, f"invariant 6: {j} restarts, yet /paths has ranks on paths: {on}"
            return
        moved = ps["failed_over_ranks"]
        assert (jb["mode"] == "failed_over") == bool(moved), (
            f"invariant 6: {j} is {jb['mode']} with ranks {moved} on their backups"
        )
        # Where the commands of this incarnation sent each rank: its newest failover or
        # fail-back that is applied or on its way (a refused or withdrawn one moved nothing).
        sent: dict[int, str] = {}
        for c in self.in_order(cs):
            if c["incarnation"] != self.incarnation[j] or c["state"] in ("superseded", "failed"):
                continue
            if c["kind"] == "failover":
                sent.update(dict.fromkeys(c["ranks"], "backup"))
            elif c["kind"] == "failback":
                sent.update(dict.fromkeys(self.returning(c, ds), "primary"))
        for r, row in self.rows(ps).items():
            where = "backup" if r in moved else "primary"
            assert sent.get(r, "primary") == where, (
                f"invariant 6: /paths has {j}'s rank {r} on its {where} ({row['active']}); the "
                f"commands sent it to its {sent.get(r, 'primary')}"
            )

    def check_restarts(
        self,
        j: str,
        ds: list[dict[str, Any]],
        open_faults: list[dict[str, Any]],
        fabric: dict[str, Any],
    ) -> None:
        """4: at most one restart per fault evidence per placement."""
        seen = self.restarts.setdefault(j, {})
        nodes = frozenset(self.nodes_of(j))
        evidence = frozenset(
            [f"fault:{f['id']}" for f in open_faults if f["node"] in nodes]
            + [f"switch:{s['id']}" for s in fabric["switch_faults"] if s["cleared_at"] is None]
            + [f"window:{w}" for w in self.windows]
        )
        for d in reversed(ds):
            if d["action"] not in RESTARTS or d["decision_id"] in seen:
                continue
            self.restart_at[j] = datetime.fromisoformat(d["created_at"])
            for other, (where, before) in seen.items():
                assert where != nodes or not evidence <= before, (
                    f"invariant 4: {j} restarted again ({d['decision_id']}: {d['reason']}) on "
                    f"the same nodes {sorted(nodes)} with no new evidence since {other} "
                    f"({sorted(evidence)})"
                )
            seen[d["decision_id"]] = (nodes, evidence)

    def check_fresh_read(self, j: str) -> None:
        """Invariant 8: reconcile on the caches the service decides on (the job's placement
        and engine index, its nodes' s-Bond plans) says what it says on the store alone,
        read afresh in the same transaction, with no cache."""
        with self.sessions() as s:
            row = JobRepo(s).get(j)
            assert row is not None
            now = self.clock()
            _, _, cached = reconciler.current(s, row, now, self.settings)
            fresh = fresh_reconcile(s, row, now, self.settings)
        differ = {
            f.name: (getattr(cached, f.name), getattr(fresh, f.name))
            for f in fields(cached)
            if getattr(cached, f.name) != getattr(fresh, f.name)
        }
        assert not differ, (
            f"invariant 8: job {j}'s reconcile on the caches differs from a fresh read in "
            + "; ".join(f"{name}: {a} != {b}" for name, (a, b) in differ.items())[:4000]
        )


def fresh_reconcile(session: Session, job: m.Job, now: datetime, settings: Settings) -> Reconciled:
    """What reconcile says from the store alone: the placement read whole, every node planned
    anew (a plan cache of its own), no job index."""
    state = reconciler.job_state(session, job)
    shared, fabric.PLANS = fabric.PLANS, fabric.PlanCache()
    try:
        view, _ = fabric.view_for(session, {n for _, n, _ in state.ranks}, now, settings)
    finally:
        fabric.PLANS = shared
    return reconcile.reconcile(now, state, view, reconciler.options(settings))
