"""Wakes command long-polls on this replica as soon as a commit issues commands.

Pollers also re-read the store every second, which is how commands issued by
another replica reach them; this only makes the common case immediate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class CommandNotifier:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: dict[str, asyncio.Event] = {}

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _event(self, node: str) -> asyncio.Event:
        return self._events.setdefault(node, asyncio.Event())

    async def wait(self, node: str, timeout: float) -> None:
        event = self._event(node)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return
        finally:
            event.clear()

    def notify(self, nodes: Iterable[str]) -> None:
        """Call from the event loop's own thread."""
        self._notify(list(nodes))

    def notify_threadsafe(self, nodes: Iterable[str]) -> None:
        """Callable from the worker threads that run sync routes."""
        if self._loop is None or self._loop.is_closed():
            return
        names = list(nodes)
        self._loop.call_soon_threadsafe(self._notify, names)

    def _notify(self, nodes: list[str]) -> None:
        for n in nodes:
            self._event(n).set()
