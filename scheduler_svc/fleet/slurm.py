"""Slurm actions through configurable command lines (`scontrol` by default).

Templates are split like a shell line first and each word is formatted after,
so a value with spaces or quotes stays one argument and nothing is ever run
through a shell: `Reason="{reason}"` becomes the single word `Reason=<reason>`,
exactly what scontrol receives from a shell.
"""

from __future__ import annotations

import shlex
import subprocess

from scheduler_svc.fleet.webhooks import DeliveryFailed

TIMEOUT_S = 30.0


def render(template: str, **values: str) -> list[str]:
    return [word.format(**values) for word in shlex.split(template)]


def run(argv: list[str], timeout_s: float = TIMEOUT_S) -> None:
    try:
        done = subprocess.run(  # noqa: S603  (argv from the operator's template, no shell)
            argv, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeliveryFailed(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-300:]
        raise DeliveryFailed(f"{argv[0]} exited {done.returncode}: {tail}")


def one_line(text: str, limit: int = 200) -> str:
    """Slurm keeps the reason on one line; keep it short and free of control characters."""
    return " ".join(text.split())[:limit]
