"""Railover launcher hook for `torchrun` jobs.

Each rank calls `RailoverHook.from_env()` after `init_process_group`. The ranks
exchange where they run (node name, local GPU) over the process group, rank 0
registers the whole job with the service, and from then on rank 0 reports
checkpoints and iteration times. Reporting never stops training: a service
that is down (or no RAILOVER_URL) costs a warning, not the job; the hook then
stays quiet for the rest of the run.

Checkpoint requests (FlowCheck): when a checkpoint node cannot rebuild an iteration,
the service wants a normal checkpoint at the next iteration. Rank 0 learns it from
the answers to its reports (the iteration batches, so within `report_every`
iterations) and then calls `on_checkpoint_request(iteration)` if one was given and
sets `checkpoint_requested_after`. A training loop whose checkpoint is collective
calls `hook.checkpoint_due()` on every rank once per iteration (it broadcasts rank
0's answer) and saves when it is True; reporting the saved checkpoint with
`checkpoint_saved(step)` of a later iteration ends the request:

    for step in ...:
        train_one_step()
        hook.iteration_done(seconds)
        if step % every == 0 or hook.checkpoint_due():
            save(step)
            hook.checkpoint_saved(step)

(The same request also reaches a failover-capable CCL as the plugin command
CHECKPOINT_NOW, and the fleet manager as io.railover.job.checkpoint_requested.)

Environment (beside torchrun's RANK, WORLD_SIZE, LOCAL_RANK):
    RAILOVER_URL              service base URL (unset: a warning, and no reports)
    RAILOVER_TOKEN            fleet token (optional on an open loopback service)
    RAILOVER_JOB_ID           job id; default SLURM_JOB_ID, else TORCHELASTIC_RUN_ID
    RAILOVER_NODE_NAME        this node's name as its agent registered it; default hostname
    RAILOVER_CHECKPOINT_INTERVAL_S, RAILOVER_RELOAD_S   the job's checkpoint economics
    RAILOVER_NOTIFY_URL       where the service should POST this job's events (optional)
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import torch.distributed as dist

from scheduler_svc.api.schemas.jobs import JobIn
from scheduler_svc.fleet.client import RailoverClient

log = logging.getLogger("railover.torchrun")


def job_id_from_env() -> str:
    for var in ("RAILOVER_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(var)
        if value:
            return value
    raise RuntimeError("set RAILOVER_JOB_ID (or run under Slurm or torchrun)")


def this_rank() -> dict[str, Any]:
    """Where this process runs: global rank, node name and the GPU index it drives."""
    return {
        "rank": int(os.environ["RANK"]),
        "node": os.environ.get("RAILOVER_NODE_NAME") or socket.gethostname(),
        "gpu": int(os.environ.get("LOCAL_RANK", "0")),
    }


class RailoverHook:
    def __init__(
        self,
        client: RailoverClient | None,
        job_id: str,
        rank: int,
        report_every: int = 10,
        on_checkpoint_request: Callable[[int], None] | None = None,
    ) -> None:
        # None: the job runs without Railover (no URL, or registration failed).
        self.client = client
        self.job_id = job_id
        self.rank = rank
        self.report_every = report_every
        self.on_checkpoint_request = on_checkpoint_request
        # Rank 0: the iteration a normal checkpoint must be newer than, while one is wanted.
        self.checkpoint_requested_after: int | None = None
        self._times: list[float] = []

    @classmethod
    def from_env(
        cls,
        *,
        replace: bool = True,
        on_checkpoint_request: Callable[[int], None] | None = None,
    ) -> RailoverHook:
        """Collective: every rank must call it. Registers the job from rank 0."""
        job_id = job_id_from_env()
        me = this_rank()
        placement: list[dict[str, Any] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(placement, me)
        url = os.environ.get("RAILOVER_URL")
        if not url:
            if me["rank"] == 0:
                log.warning("railover: RAILOVER_URL is not set; training without Railover")
            return cls(None, job_id, me["rank"])
        client = RailoverClient(url, os.environ.get("RAILOVER_TOKEN"))
        hook = cls(client, job_id, me["rank"], on_checkpoint_request=on_checkpoint_request)
        if hook.rank == 0:
            body: dict[str, Any] = {
                "job_id": job_id,
                "ranks": sorted((p for p in placement if p), key=lambda p: p["rank"]),
                "checkpoint_interval_s": float(
                    os.environ.get("RAILOVER_CHECKPOINT_INTERVAL_S", "3600")
                ),
                "reload_s": float(os.environ.get("RAILOVER_RELOAD_S", "600")),
                "timeout_s": float(os.environ.get("RAILOVER_TIMEOUT_S", "30")),
                "last_checkpoint_at": datetime.now(UTC),
                "dp_size": dist.get_world_size(),
            }
            if os.environ.get("RAILOVER_NOTIFY_URL"):
                body["notify_url"] = os.environ["RAILOVER_NOTIFY_URL"]
            try:
                client.register_job(JobIn.model_validate(body), replace=replace)
            except Exception as exc:  # the job goes on; the service just won't know it
                log.warning(
                    "railover: registering job %s at %s failed, training without Railover: %s",
                    job_id,
                    url,
                    exc,
                )
                client.close()
                hook.client = None
        # Nobody reports before the job exists.
        dist.barrier()
        return hook

    def checkpoint_saved(self, iteration: int) -> None:
        if self.rank == 0 and self.client is not None:
            out = self._quietly(self.client.report_checkpoint, self.job_id, iteration=iteration)
            if out is not None:
                self._requested(out.checkpoint_requested_after)

    def checkpoint_due(self) -> bool:
        """Whether the service wants a normal checkpoint now; collective when distributed.

        Every rank calls it at the same point of each iteration: rank 0's answer is
        broadcast so that all save together (one small broadcast per call).
        """
        due = [self.checkpoint_requested_after is not None]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(due, src=0)
        return bool(due[0])

    def _requested(self, after: int | None) -> None:
        """Take the service's answer; a new request calls the callback once."""
        new = after is not None and after != self.checkpoint_requested_after
        self.checkpoint_requested_after = after
        if new and after is not None:
            log.info("railover: a normal checkpoint is wanted after iteration %d", after)
            if self.on_checkpoint_request is not None:
                self.on_checkpoint_request(after)

    def iteration_done(self, seconds: float) -> None:
        """Batched: one request per `report_every` iterations, not one per step."""
        if self.rank != 0 or self.client is None:
            return
        self._times.append(seconds)
        if len(self._times) >= self.report_every:
            self.flush()

    def flush(self) -> None:
        if self._times and self.client is not None:
            times, self._times = self._times, []
            out = self._quietly(self.client.report_iteration_times, self.job_id, times)
            if out is not None:
                self._requested(out.checkpoint_requested_after)

    def close(self) -> None:
        self.flush()
        if self.client is not None:
            self.client.close()

    def _quietly(self, call: Any, *args: Any, **kw: Any) -> Any:
        try:
            return call(*args, **kw)
        except Exception as exc:  # the job goes on without the report
            log.warning("railover: %s failed: %s", getattr(call, "__name__", call), exc)
            return None


def _demo_training(steps: int, checkpoint_every: int) -> None:
    """A tiny data-parallel loop on gloo: what the hook looks like in a real script."""
    import torch  # noqa: PLC0415

    dist.init_process_group("gloo")
    hook = RailoverHook.from_env()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, steps + 1):
        started = time.perf_counter()
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
        hook.iteration_done(time.perf_counter() - started)
        # Also when the service asks (a FlowCheck node could not rebuild an iteration).
        if step % checkpoint_every == 0 or hook.checkpoint_due():
            hook.checkpoint_saved(step)
    dist.barrier()
    hook.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    _demo_training(
        steps=int(os.environ.get("DEMO_STEPS", "20")),
        checkpoint_every=int(os.environ.get("DEMO_CHECKPOINT_EVERY", "10")),
    )
