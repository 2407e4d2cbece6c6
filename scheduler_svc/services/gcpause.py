"""Whole-job work without the cyclic garbage collector walking the heap meanwhile.

Registering a 65,536-rank job, or building its engine index, allocates about a
million objects that all stay alive until the work ends. Each time the young
objects outnumber a quarter of the old ones, CPython's collector walks the whole
heap (every node's topology and plan, the ORM's identity map), finding nothing to
free: measured on the index build alone, that is more than half its time. Inside
`paused()` the collector does not run; it is enabled again when the last pause in
any thread ends, and cyclic garbage made meanwhile is collected by its next pass.
Reference counting frees everything else as usual. The service also pauses it for a
request with a large body, from its arrival to its answer's end
(`scheduler_svc.main.PauseCollectorForLargeBodies`): FastAPI validates the body before
the route's own pause begins.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Pauses:
    """The pauses in progress, in every thread, and whether to enable the collector after."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._resume = False  # whether the first pause found the collector enabled

    def enter(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._depth += 1

    def leave(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._resume:
                gc.enable()


_PAUSES = _Pauses()


@contextmanager
def paused() -> Iterator[None]:
    _PAUSES.enter()
    try:
        yield
    finally:
        _PAUSES.leave()
