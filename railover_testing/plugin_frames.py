"""Encoded plugin frames in bulk, for tests that flood the agent's plugin socket."""

from __future__ import annotations

import random
import time

from native_plugin import wire, wire_codec


def random_progress(
    rng: random.Random, frames: int, pid: int, *, ranks: int = 1, now_ns: int | None = None
) -> bytes:
    """`frames` PROGRESS frames from process `pid`, back to back, each of a random
    communicator (from `rng`), the n-th with ops_done n and rank n % `ranks`; stamped
    `now_ns`, or the time each is encoded."""
    return b"".join(
        wire_codec.encode(
            wire.Progress(
                comm_id=rng.getrandbits(63) | 1,
                ops_done=n,
                timestamp_ns=time.time_ns() if now_ns is None else now_ns,
                rank=n % ranks,
                pid=pid,
            )
        )
        for n in range(frames)
    )
