"""The fleet twin's fleet manager: what a Slurm-like scheduler does with what the service
decided and what broke. It aborts a job whose rank died when the service did not, requeues
an aborted job from its checkpoint with a free healthy node in place of each broken one,
and, with too few free, restarts it without the nodes the service said to leave out
(restart_scaled) or leaves it waiting (down) until a repair; a shrunk job grows back at a
checkpoint once enough nodes are free.

A mixin of scheduler_svc.twin.loop.Twin, which holds the cluster's state and the service
client; nothing here decides what the service decides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from scheduler_svc.twin.books import TwinJob
from scheduler_svc.twin.cluster import RAILS, ClusterSpec, node_name


class FleetManager:
    """The fleet manager's part of the twin (see the module docstring)."""

    spec: ClusterSpec
    jobs: dict[str, TwinJob]
    waiting: list[TwinJob]  # aborted, no spare free for a broken node
    dead_gpus: dict[tuple[str, int], float]
    dead_nodes: dict[str, float]
    down: Counter[tuple[str, int]]  # (node, rail) -> reasons it is down
    fleet_aborts: int
    now_s: float

    def at(self, t: float, act: Callable[[], None]) -> None:
        raise NotImplementedError  # the twin's event queue

    def post_job(self, job: TwinJob) -> None:
        raise NotImplementedError  # the twin posts the job to the service

    def schedule_checkpoint(self, job: TwinJob, after: float) -> None:
        raise NotImplementedError

    def fleet_abort(self, job: TwinJob, generation: int) -> None:
        if job.aborted or generation != job.generation:
            return  # the service had it restarted, or it was placed again since
        job.accrue(self.now_s)
        self.fleet_aborts += 1
        job.roll_back()
        job.generation += 1
        job.aborted = True
        job.state = "down"
        job.on_backup = set()
        self.requeue(job)

    def aborted(self, job: TwinJob) -> None:
        """The job's processes were aborted: it hangs until its timeout and detection, then
        the fleet manager requeues it from its checkpoint, a spare in place of each node
        with a part down where one is free."""
        job.accrue(self.now_s)
        job.roll_back()
        job.generation += 1
        # A restart at a checkpoint stops cleanly; after a fault the collective hangs
        # until its timeout, and the job's failure is detected.
        job.aborted = True
        if job.state == "hung":
            job.hung_until = max(
                job.hung_until, self.now_s + job.spec.timeout_s + job.spec.detect_s
            )
        else:
            job.state, job.hung_until = "down", self.now_s
        job.on_backup = set()
        self.at(job.hung_until, lambda: self.requeue(job))

    def free_nodes(self) -> list[str]:
        """Healthy nodes no job holds, in order."""
        taken = {n for j in self.jobs.values() for n in j.nodes}
        return [
            node_name(i)
            for i in range(self.spec.nodes)
            if node_name(i) not in taken and not self.broken(node_name(i))
        ]

    def requeue(self, job: TwinJob) -> None:
        """Place the job again from its checkpoint, a free node in place of each broken
        one. With too few free, it restarts without the nodes the service said to leave
        out (restart_scaled) if free ones cover the rest, and else waits (still down) for
        a repair."""
        job.accrue(self.now_s)
        free = self.free_nodes()
        broken = [n for n in job.nodes if self.broken(n)]
        if len(broken) > len(free):
            kept = [n for n in job.nodes if n not in job.drop]
            if not job.drop or not kept or sum(map(self.broken, kept)) > len(free):
                if job not in self.waiting:
                    self.waiting.append(job)
                return
            job.nodes = kept
        if job in self.waiting:
            self.waiting.remove(job)
        job.drop = ()
        self.place(job, [free.pop(0) if self.broken(n) else n for n in job.nodes])

    def grow(self, job: TwinJob) -> None:
        """At a checkpoint of a shrunk job, with enough healthy nodes free again, the fleet
        manager stops it cleanly and restarts it at its full size (a reload, no work
        lost: as the planner's restart_scaling assumes)."""
        free = self.free_nodes()
        missing = job.full_nodes - len(job.nodes)
        if job.state != "up" or missing <= 0 or len(free) < missing:
            return
        job.roll_back()  # nothing since the checkpoint just taken
        job.generation += 1
        job.on_backup = set()
        self.place(job, job.nodes + free[:missing])

    def place(self, job: TwinJob, nodes: list[str]) -> None:
        """The job's next incarnation on `nodes`, reloading from its checkpoint."""
        job.nodes = nodes
        job.incarnation += 1
        job.aborted = False
        job.state, job.ready_at = "reloading", self.now_s + job.spec.reload_s
        self.post_job(job)
        self.schedule_checkpoint(job, job.spec.reload_s + job.spec.interval_s)

    def retry_waiting(self) -> None:
        """A repair may have freed what a waiting job needs: the first waiting first."""
        for job in list(self.waiting):
            self.requeue(job)

    def broken(self, node: str) -> bool:
        return (
            node in self.dead_nodes
            or any(n == node for n, _ in self.dead_gpus)
            or any(self.down[(node, r)] > 0 for r in range(RAILS))
        )
