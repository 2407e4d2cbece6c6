"""Log lines that a local process cannot forge or flood.

Names a plugin client sends (devices, jobs, hosts) and rows read back from disk reach
log lines; ``printable`` escapes everything but printable ASCII, so a name holding a
newline writes ``\\n``, not a second line. ``Every`` lets one line through per interval
and says how many it held back, for refusals an attacker can repeat at will.
"""

from __future__ import annotations

import logging
import time


def printable(text: object, limit: int = 200) -> str:
    """`text` with control and non-ASCII characters escaped, cut at `limit` characters."""
    s = str(text)
    # unicode_escape writes a newline as \n, any other control or non-ASCII character as
    # \xNN or \uNNNN, and a backslash as two: the escaped text reads back unambiguously.
    plain = s.isascii() and s.isprintable() and "\\" not in s
    out = s if plain else s.encode("unicode_escape").decode("ascii")
    return out if len(out) <= limit else out[:limit] + "..."


class Every:
    """At most one log line per `interval_s`; the next says how many were held back."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last = -float("inf")
        self._held = 0

    def log(self, level: int, msg: str, *args: object) -> bool:
        """Log the line, or count it; True if it was written."""
        now = time.monotonic()
        if now - self._last < self.interval_s:
            self._held += 1
            return False
        if self._held:
            msg += f" ({self._held} more like it in the last {self.interval_s:g}s not logged)"
        self._last = now
        self._held = 0
        self.logger.log(level, msg, *args)
        return True
