"""Typed client for training launchers: register the job, report progress, learn decisions.

    from scheduler_svc.fleet.client import RailoverClient

    with RailoverClient("http://railover:8080", token=os.environ["RAILOVER_TOKEN"]) as rv:
        rv.register_job(JobIn(...), replace=True)
        rv.report_checkpoint("job-42", iteration=1000)
        decision = rv.wait_for_decision("job-42", timeout_s=60)

FlowCheck: a checkpoint node that cannot rebuild an iteration calls
`report_mirror_failure`; the job then learns that a normal checkpoint is wanted from
`checkpoint_requested_after` on the answers to `report_iteration_times` and
`report_checkpoint` (or `checkpoint_requested`), until it reports a newer one.

Every call has a timeout; connection errors and 5xx answers are retried with
exponential backoff (the service is idempotent for all of them: a job
registration that was stored before the connection dropped answers 409, which
`register_job(replace=False)` treats as done when the stored job is the same).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from pydantic import BaseModel

from scheduler_svc.api.schemas.commands import CommandList, CommandOut
from scheduler_svc.api.schemas.decisions import (
    DecisionList,
    DecisionOut,
    IterationsIn,
    IterationsOut,
)
from scheduler_svc.api.schemas.events import EventsAccepted
from scheduler_svc.api.schemas.jobs import (
    CheckpointIn,
    CheckpointOut,
    JobIn,
    JobOut,
    MirrorFailureIn,
    MirrorFailureOut,
)
from scheduler_svc.api.schemas.nodes import NodeOut
from scheduler_svc.api.schemas.paths import JobPathsOut
from scheduler_svc.fleet.schemas import SubscriptionCreated, SubscriptionIn

T = TypeVar("T", bound=BaseModel)


class RailoverError(Exception):
    """The service refused a call; `status` and `body` say why."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class RailoverClient:
    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout_s: float = 10.0,
        retries: int = 4,
        backoff_s: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport
        )
        self._retries = retries
        self._backoff_s = backoff_s

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- calls -------------------------------------------------------------------

    def register_job(self, job: JobIn, *, replace: bool = False) -> JobOut:
        """Register the job; with replace=True an existing job of that id is replaced.

        A 409 for another reason (a GPU another running job holds: set ``job.replaces``
        to end that job) is raised as it came."""
        body = job.model_dump(mode="json", exclude_none=True)
        try:
            return self._call("POST", "/v1/jobs", JobOut, json=body)
        except RailoverError as exc:
            if exc.status != 409:
                raise
            conflict = exc
        if not replace:
            try:
                return self.get_job(job.job_id)
            except RailoverError as exc:
                if exc.status == 404:  # not this job's own: the 409 was about another
                    raise conflict from None
                raise
        self.delete_job(job.job_id)
        return self._call("POST", "/v1/jobs", JobOut, json=body)

    def get_job(self, job_id: str) -> JobOut:
        return self._call("GET", f"/v1/jobs/{job_id}", JobOut)

    def job_paths(self, job_id: str) -> JobPathsOut:
        """Every rank's primary and backup RNIC, switch, and the one it uses now."""
        return self._call("GET", f"/v1/jobs/{job_id}/paths", JobPathsOut)

    def get_node(self, name: str) -> NodeOut:
        return self._call("GET", f"/v1/nodes/{name}", NodeOut)

    def delete_job(self, job_id: str) -> None:
        self._request("DELETE", f"/v1/jobs/{job_id}", ok=(204, 404))

    def report_checkpoint(
        self,
        job_id: str,
        *,
        iteration: int | None = None,
        at: datetime | None = None,
        kind: str = "full",
        incarnation: int | None = None,
        spare_nodes: bool | None = None,
        spares_free: int | None = None,
    ) -> CheckpointOut:
        """A usable checkpoint exists now (or at `at`): restart would resume from here.
        `incarnation`: the job's incarnation that took it (the processes know it);
        `spare_nodes`: whether a healthy spare node is free now, or `spares_free`: how many
        (left out: as last said)."""
        body = CheckpointIn.model_validate(
            {
                "at": at or datetime.now(UTC),
                "iteration": iteration,
                "kind": kind,
                "incarnation": incarnation,
                "spare_nodes": spare_nodes,
                "spares_free": spares_free,
            }
        )
        return self._call(
            "POST",
            f"/v1/jobs/{job_id}/checkpoints",
            CheckpointOut,
            json=body.model_dump(mode="json", exclude_none=True),
        )

    def report_mirror_failure(
        self, job_id: str, iteration: int, *, at: datetime | None = None
    ) -> MirrorFailureOut:
        """A checkpoint node could not rebuild `iteration`: the job is asked to checkpoint.

        Safe to retry: a report of an iteration already recorded answers created=False.
        """
        body = MirrorFailureIn.model_validate(
            {"iteration": iteration, "at": at or datetime.now(UTC)}
        )
        return self._call(
            "POST",
            f"/v1/jobs/{job_id}/mirror-failures",
            MirrorFailureOut,
            json=body.model_dump(mode="json"),
        )

    def checkpoint_requested(self, job_id: str) -> int | None:
        """The iteration a normal checkpoint must now be newer than; None when none is wanted."""
        return self.get_job(job_id).checkpoint_requested_after

    def report_iteration_times(self, job_id: str, seconds: Sequence[float]) -> IterationsOut:
        """Iteration wall times (a batch); the service derives the measured slowdown k."""
        body = IterationsIn.model_validate({"iteration_time_s": list(seconds)})
        return self._call(
            "POST", f"/v1/jobs/{job_id}/iterations", IterationsOut, json=body.model_dump()
        )

    def decisions(self, job_id: str, limit: int = 100) -> list[DecisionOut]:
        """The job's decisions, newest first."""
        got = self._call(
            "GET", f"/v1/jobs/{job_id}/decisions", DecisionList, params={"limit": limit}
        )
        return got.decisions

    def wait_for_decision(
        self,
        job_id: str,
        *,
        after: DecisionOut | None = None,
        timeout_s: float = 60.0,
        poll_s: float = 1.0,
    ) -> DecisionOut | None:
        """The oldest decision made after `after` (any decision, if None); None on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            newer = [
                d
                for d in self.decisions(job_id)
                if after is None
                or (d.created_at, d.decision_id) > (after.created_at, after.decision_id)
            ]
            if newer:
                return min(newer, key=lambda d: (d.created_at, d.decision_id))
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

    def follow_decisions(
        self, job_id: str, *, poll_s: float = 1.0, stop: Callable[[], bool] = lambda: False
    ) -> Iterator[DecisionOut]:
        """Yield each decision made from now on (polling); for push, use `subscribe`."""
        after = next(iter(self.decisions(job_id, limit=1)), None)
        while not stop():
            d = self.wait_for_decision(job_id, after=after, timeout_s=poll_s * 5, poll_s=poll_s)
            if d is not None:
                after = d
                yield d

    def subscribe(
        self,
        url: str,
        *,
        job_id: str | None = None,
        event_types: list[str] | None = None,
        secret: str | None = None,
        description: str = "",
    ) -> SubscriptionCreated:
        """Push: signed CloudEvents to `url` (needs a fleet token). Keep the returned secret."""
        body = SubscriptionIn.model_validate(
            {
                "url": url,
                "job_id": job_id,
                "event_types": event_types or [],
                "secret": secret,
                "description": description,
            }
        )
        return self._call(
            "POST",
            "/v1/subscriptions",
            SubscriptionCreated,
            json=body.model_dump(mode="json", exclude_none=True),
        )

    # --- what a node's agent does (the fleet twin drives the service with these) -----

    def register_node(self, name: str, body: Mapping[str, Any]) -> NodeOut:
        """Register (or re-register) node `name` as its agent discovered it (NodeIn)."""
        return self._call("PUT", f"/v1/nodes/{name}", NodeOut, json=dict(body))

    def report_events(self, events: Sequence[Mapping[str, Any]]) -> EventsAccepted:
        """Report a batch of events (EventBatch); each is stored once by its event id."""
        return self._call("POST", "/v1/events", EventsAccepted, json={"events": list(events)})

    def node_commands(self, node: str) -> list[CommandOut]:
        """The commands waiting for `node`'s processes (marks them delivered)."""
        return self._call("GET", f"/v1/nodes/{node}/commands", CommandList).commands

    def ack_command(self, command_id: int, node: str, status: str) -> CommandOut:
        """The node's processes answer a command: applied, failed or too_late."""
        body = {"node": node, "status": status}
        return self._call("POST", f"/v1/commands/{command_id}/acks", CommandOut, json=body)

    def job_commands(self, job_id: str, states: Sequence[str] = ()) -> list[CommandOut]:
        """Every command issued for the job, with its delivery state; only those in
        `states` where given (say `("issued",)`: those no agent has taken yet)."""
        params = {"state": list(states)} if states else None
        return self._call("GET", f"/v1/jobs/{job_id}/commands", CommandList, params=params).commands

    # --- plumbing ----------------------------------------------------------------

    def _call(self, method: str, path: str, model: type[T], **kw: Any) -> T:
        return model.model_validate(self._request(method, path, **kw).json())

    def _request(
        self, method: str, path: str, *, ok: tuple[int, ...] = (), **kw: Any
    ) -> httpx.Response:
        delay = self._backoff_s
        for attempt in range(self._retries + 1):
            last = attempt == self._retries
            try:
                response = self._http.request(method, path, **kw)
            except httpx.TransportError:
                if last:
                    raise
            else:
                if response.is_success or response.status_code in ok:
                    return response
                if response.status_code < 500 or last:
                    try:
                        detail: Any = response.json()
                    except ValueError:
                        detail = response.text
                    raise RailoverError(response.status_code, detail)
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover
