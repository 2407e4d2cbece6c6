"""How the fleet twin's agents' reports reach the service: now, late, twice, or kept by an
agent that is cut off until it is back, each stamped by its node's skewed clock.

The twin (scheduler_svc.twin.loop) hands each report here; this module decides only when
it arrives, never what it says, and hands it back to the twin's `deliver` to post.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import numpy as np

from scheduler_svc.config import Settings
from scheduler_svc.twin.cluster import Reports, node_name

Batch = list[dict[str, Any]]


class Network:
    """The reports' way to the service under `Reports`, with its counts: late (held back),
    twice (sent again), held (by a cut-off agent)."""

    def __init__(
        self,
        reports: Reports,
        *,
        seed: int,
        nodes: int,
        at: Callable[[float, Callable[[], None]], None],
        deliver: Callable[[str, Batch], None],
    ) -> None:
        bound = Settings.model_fields["observed_at_future_skew_s"].default
        if reports.skew_s > bound:
            raise ValueError(
                f"skew_s: at most the service's observed_at_future_skew_s ({bound:g} s), "
                f"got {reports.skew_s:g}"
            )
        self.reports = reports
        # Its own stream, so that the fault trace is the same whatever the reports do.
        self.rng = np.random.default_rng([seed, 1])
        s = reports.skew_s
        self.skew = {node_name(i): float(self.rng.uniform(-s, s)) for i in range(nodes)}
        self.at = at
        self.deliver = deliver
        self.cut_off: dict[str, list[Batch]] = {}
        self.counts: Counter[str] = Counter()

    def clock(self, node: str, now: datetime) -> datetime:
        """The time on the node's own clock."""
        return now + timedelta(seconds=self.skew[node])

    def send(self, node: str, batch: Batch, now_s: float) -> None:
        """The node's agent sends `batch`: kept while it is cut off, else now or later as
        the dice say, and perhaps a second time."""
        if node in self.cut_off:
            self.counts["held"] += 1
            self.cut_off[node].append(batch)
            return
        r = self.reports
        if r.delay_p and self.rng.random() < r.delay_p:
            self.counts["late"] += 1
            self.at(now_s + self.rng.uniform(0, r.max_delay_s), partial(self.deliver, node, batch))
        else:
            self.deliver(node, batch)
        if r.duplicate_p and self.rng.random() < r.duplicate_p:
            self.counts["twice"] += 1
            self.at(now_s + self.rng.uniform(0, r.max_delay_s), partial(self.deliver, node, batch))

    def cut(self, node: str) -> bool:
        """The node's agent loses the service; False when it had already."""
        if node in self.cut_off:
            return False
        self.cut_off[node] = []
        return True

    def is_cut(self, node: str) -> bool:
        return node in self.cut_off

    def heal(self, node: str) -> None:
        """The node's agent reaches the service again: what it kept goes, in order."""
        for batch in self.cut_off.pop(node, []):
            self.deliver(node, batch)
