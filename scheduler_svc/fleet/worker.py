"""The delivery worker: one per replica, safe to run in all of them at once.

Each cycle claims due lane heads (fleet.repositories.OutboxRepo.claim), as many as
there are free slots, and hands each to a pool thread that sends it and records the
outcome in its own short transaction (lanes are independent; within a lane there is only
ever one in flight). The cycle does not wait for what it handed out: a slow receiver
holds one slot, for one attempt's deadline at most, while the others go on. Fleet
actions (Kubernetes, Slurm) have a pool of their own, so they never queue behind
webhooks. The loop wakes at once when a request of this replica commits an event or a
slot frees, and otherwise re-reads the outbox every `delivery_poll_s` for other
replicas' events and due retries.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from scheduler_svc import metrics
from scheduler_svc.config import Settings
from scheduler_svc.fleet import actions, outbound, slurm
from scheduler_svc.fleet.events import WROTE_KEY
from scheduler_svc.fleet.repositories import DEAD, DELIVERED, OutboxRepo, SubscriptionRepo
from scheduler_svc.fleet.webhooks import DeliveryFailed, post_event
from scheduler_svc.store import models as m
from scheduler_svc.store.uow import unit_of_work

log = logging.getLogger("railover.fleet")
WEBHOOKS, ACTIONS = "webhooks", "actions"
# Kubernetes and Slurm calls in flight at once: few targets, each call bounded by its own
# timeouts (30 s scontrol, the client's), and none ever waits for a webhook slot.
ACTION_SLOTS = 2
# A claim outlives any single attempt (HTTP timeout, 30 s scontrol, k8s calls), so
# two replicas never send the same head at once unless the first one died.
MIN_LEASE_S = 120.0


def backoff_s(attempt: int, base_s: float, cap_s: float, rnd: Callable[[], float]) -> float:
    """Delay before retry number `attempt` (1-based): exponential, capped, equal jitter.

    Half the delay is fixed so retries never bunch at zero; the other half is
    random so receivers that came back are not hit by every sender at once.
    """
    delay: float = min(cap_s, base_s * 2 ** max(0, attempt - 1))
    return delay / 2 + rnd() * delay / 2


def target_kind(target: str) -> str:
    """Bounded metric label: webhook | k8s | slurm."""
    return "webhook" if target.startswith(("sub:", "job:")) else target


@dataclass(frozen=True, slots=True)
class Work:
    delivery_id: int
    target: str
    url: str
    attempts: int
    secret: str | None
    event: m.OutboxEvent  # detached copy, read-only


class DeliveryWorker:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        settings: Settings,
        *,
        k8s: Any = None,
        rnd: Callable[[], float] = random.random,
        resolver: outbound.Resolver = outbound.system_resolver,
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.worker_id = f"{socket.gethostname()[:32]}-{os.getpid()}-{secrets.token_hex(4)}"
        self._rnd = rnd
        self._k8s = k8s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pools = {
            WEBHOOKS: ThreadPoolExecutor(
                settings.delivery_concurrency, thread_name_prefix="railover-delivery"
            ),
            ACTIONS: ThreadPoolExecutor(ACTION_SLOTS, thread_name_prefix="railover-actions"),
        }
        self._slots = {WEBHOOKS: settings.delivery_concurrency, ACTIONS: ACTION_SLOTS}
        self._busy = {WEBHOOKS: 0, ACTIONS: 0}
        self._busy_lock = threading.Lock()
        self._busy_targets: set[str] = set()  # one delivery per target in flight at most
        self._http = outbound.webhook_client(settings, resolver)
        self._lease = timedelta(seconds=max(MIN_LEASE_S, 3 * settings.webhook_timeout_s))

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        event.listen(self.sessions, "after_commit", self._after_commit)
        self._thread = threading.Thread(target=self._run, name="railover-outbox", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Finish what is in flight, hand back unstarted claims, stop."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        event.remove(self.sessions, "after_commit", self._after_commit)
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        try:
            with unit_of_work(self.sessions) as s:
                OutboxRepo(s).release(self.worker_id)
        except Exception:  # the store may already be gone; leases expire anyway
            log.warning("could not release outbox claims on shutdown", exc_info=True)
        self._http.close()

    def close_unstarted(self) -> None:
        """Free a worker driven by run_once and never started (stop() removes the commit
        listener start() adds, and SQLAlchemy refuses to remove one that is not there)."""
        for pool in self._pools.values():
            pool.shutdown(wait=True)
        self._http.close()

    def wake(self) -> None:
        self._wake.set()

    def _after_commit(self, session: Session) -> None:
        if session.info.pop(WROTE_KEY, False):
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                handed_out = len(self.dispatch())
            except Exception:
                log.exception("outbox delivery cycle failed; retrying")
                handed_out = 0
            if not handed_out:
                self._wake.wait(self.settings.delivery_poll_s)
                self._wake.clear()

    # --- one cycle ---------------------------------------------------------------

    def run_once(self) -> int:
        """Claim, send and record one batch and wait for it (tests drive the worker so);
        returns how many deliveries it handled."""
        futures = self.dispatch()
        wait(futures)
        for future in futures:
            future.result()
        return len(futures)

    def dispatch(self) -> list[Future[None]]:
        """Hand each free slot a claimed delivery; the pool records its outcome."""
        futures = []
        for kind in (ACTIONS, WEBHOOKS):
            with self._busy_lock:
                free = self._slots[kind] - self._busy[kind]
                busy_targets = set(self._busy_targets)
            if free <= 0:
                continue
            for item in self._claim(kind, free, busy_targets):
                with self._busy_lock:
                    self._busy[kind] += 1
                    self._busy_targets.add(item.target)
                futures.append(self._pools[kind].submit(self._deliver, kind, item))
        return futures

    def _deliver(self, kind: str, item: Work) -> None:
        try:
            self._record(item, self._attempt(item))
        except Exception:  # the store may be away: the lease expires, it is retried
            log.exception("recording delivery %s failed", item.delivery_id)
        finally:
            with self._busy_lock:
                self._busy[kind] -= 1
                self._busy_targets.discard(item.target)
            self._wake.set()

    def _claim(self, kind: str, limit: int, busy_targets: set[str]) -> list[Work]:
        now = datetime.now(UTC)
        with unit_of_work(self.sessions) as s:
            repo = OutboxRepo(s)
            rows = repo.claim(
                worker=self.worker_id,
                now=now,
                until=now + self._lease,
                limit=limit,
                actions=kind == ACTIONS,
                busy_targets=busy_targets,
            )
            if not rows:
                return []
            events = repo.events([r.outbox_id for r in rows])
            subs = SubscriptionRepo(s)
            work = []
            for r in rows:
                secret: str | None = None
                if r.target.startswith("sub:"):
                    sub = subs.get(r.target[4:])
                    secret = None if sub is None else sub.secret
                elif r.target.startswith("job:") and self.settings.notify_secret is not None:
                    secret = self.settings.notify_secret.get_secret_value()
                work.append(Work(r.id, r.target, r.url, r.attempts, secret, events[r.outbox_id]))
            s.expunge_all()
        return work

    def _attempt(self, item: Work) -> DeliveryFailed | int:
        try:
            if item.target in ("k8s", "slurm"):
                self._act(item)
                return 0
            if item.secret is None:
                return DeliveryFailed("no signing secret for this target (deleted or unset)")
            return post_event(
                self._http, item.url, item.secret, item.event, self.settings.webhook_timeout_s
            )
        except DeliveryFailed as exc:
            return exc
        except Exception as exc:  # a bug in one target must not stall the others
            log.exception("delivery %s to %s crashed", item.delivery_id, item.target)
            return DeliveryFailed(f"{type(exc).__name__}: {exc}")

    def _act(self, item: Work) -> None:
        ev = item.event
        now = datetime.now(UTC)
        if item.target == "k8s":
            if self._k8s is None:
                from scheduler_svc.fleet.kubernetes import KubernetesActions  # noqa: PLC0415

                self._k8s = KubernetesActions(self.settings)
            for flag in actions.node_flags(ev.type, ev.data):
                self._k8s.flag_node(flag, event_id=ev.event_id, now=now)
            for clear in actions.node_clears(ev.type, ev.data):
                self._k8s.clear_node(clear, event_id=ev.event_id, now=now)
            return
        scontrol = slurm.SlurmActions(self.settings)
        # Mark the node before the requeue, so the job cannot start there again.
        for flag in actions.node_flags(ev.type, ev.data):
            scontrol.flag(flag)
        for clear in actions.node_clears(ev.type, ev.data):
            scontrol.clear(clear)
        job = actions.requeue_job(ev.type, ev.data)
        if job is not None:
            scontrol.requeue(job)

    def _record(self, item: Work, outcome: DeliveryFailed | int) -> None:
        now = datetime.now(UTC)
        kind = target_kind(item.target)
        attempts = item.attempts + 1
        values: dict[str, Any] = {"attempts": attempts}
        if isinstance(outcome, int):
            values.update(state=DELIVERED, delivered_at=now, last_status=outcome or None)
            values["last_error"] = None
            result = "delivered"
        else:
            values.update(last_status=outcome.status, last_error=str(outcome)[:2000])
            if attempts >= self.settings.webhook_max_attempts:
                values.update(state=DEAD, dead_at=now)
                result = "dead"
                log.warning(
                    "delivery %s to %s dead after %d attempts: %s",
                    item.delivery_id,
                    item.target,
                    attempts,
                    outcome,
                )
            else:
                delay = backoff_s(
                    attempts,
                    self.settings.webhook_backoff_base_s,
                    self.settings.webhook_backoff_max_s,
                    self._rnd,
                )
                values["next_attempt_at"] = now + timedelta(seconds=delay)
                result = "retry"
        with unit_of_work(self.sessions) as s:
            if not OutboxRepo(s).finish(item.delivery_id, self.worker_id, **values):
                return  # our lease lapsed and another replica took it over
        metrics.DELIVERIES.labels(target=kind, result=result).inc()
        if result == "delivered":
            metrics.DELIVERY_LATENCY.labels(target=kind).observe(
                (now - item.event.created_at).total_seconds()
            )
