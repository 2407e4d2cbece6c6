"""Counting an agent's polls, so a test can say "seen at the next poll" without a clock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from agent.collectors.base import Collected
from agent.topology import Topology
from railover_testing.agents import AgentThread


class PollLog:
    """Wraps one collector of a running agent and numbers its collect() calls.

    `mark()` notes the current call count (from the test's thread); `found_by(pred)`
    is the number of the first call whose events satisfy `pred`.
    """

    def __init__(self, agent: AgentThread, name: str) -> None:
        (self.collector,) = [c for c in agent.agent.collectors if c.name == name]
        self._lock = threading.Lock()
        self.started = 0
        self.results: list[tuple[int, list[dict[str, Any]]]] = []
        inner: Callable[[Topology | None], Collected] = self.collector.collect

        def counted(topology: Topology | None) -> Collected:
            with self._lock:
                self.started += 1
                number = self.started
            got = inner(topology)
            with self._lock:
                self.results.append((number, list(got.events)))
            return got

        setattr(self.collector, "collect", counted)  # noqa: B010  # an instance attribute

    def mark(self) -> int:
        with self._lock:
            return self.started

    def found_by(self, pred: Callable[[dict[str, Any]], bool]) -> int | None:
        with self._lock:
            for number, events in self.results:
                if any(pred(e) for e in events):
                    return number
        return None
