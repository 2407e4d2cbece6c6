"""Waiting on a condition, the one way tests synchronise with what they drive.

A test never sleeps to let something happen: it polls the condition it is about
to assert, with a deadline that is generous (a loaded 2-core machine is slow,
not wrong) and a failure that says what it waited for and what it saw.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(pred: Callable[[], object], timeout: float = 5.0, step: float = 0.02) -> bool:
    """Poll `pred` until it is truthy; False if it never was within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def wait_for(
    what: str,
    check: Callable[[], T],
    timeout_s: float,
    detail: Callable[[], object] | None = None,
    *,
    step: float = 0.05,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll `check` until it returns something truthy, and return that.

    Exceptions of the `ignoring` types count as "not yet" (a service still
    starting refuses connections). At the deadline, fail naming `what`, with
    `detail()` (the state worth seeing) or else the last result.
    """
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            got = check()
        except ignoring as exc:
            last = exc
        else:
            if got:
                return got
            last = got
        if time.monotonic() > deadline:
            seen = detail() if detail is not None else last
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}: {seen!r}")
        time.sleep(step)


def thread_stacks() -> str:
    """Where every thread of this process is now: what a test that gave up waiting on a
    service it runs in-process shows, so a hang names the call it is stuck in."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        f"--- thread {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
    )
