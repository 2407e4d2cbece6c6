"""Slurm actions through `scontrol` (see fleet.actions for which event does what).

Drain and requeue go through operator-configurable command lines (settings
`slurm_drain_command`, `slurm_requeue_command`); every other step runs
`slurm_scontrol` (a path, or a prefix such as `sudo -n scontrol`). Templates are
split like a shell line first and each word is formatted after, so a value with
spaces or quotes stays one argument and nothing is ever run through a shell:
`Reason="{reason}"` becomes the single word `Reason=<reason>`, exactly what
scontrol receives from a shell.

Every step is safe to repeat, because a failed delivery is retried from the top:
a requeue reads the job first and skips what is already done, and a repair only
resumes a node whose drain reason, or clears a comment, that Railover wrote.
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess

from scheduler_svc.config import Settings
from scheduler_svc.fleet.actions import NodeClear, NodeFlag, Requeue, SlurmMark
from scheduler_svc.fleet.webhooks import DeliveryFailed

log = logging.getLogger("railover.fleet")
TIMEOUT_S = 30.0
# Railover's own marks start with this, so a repair never undoes an administrator's.
MARK = "railover:"
SEPARATOR = " | "
REQUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9/:_]*)=")


def render(template: str, **values: str) -> list[str]:
    return [word.format(**values) for word in shlex.split(template)]


def run(argv: list[str], timeout_s: float = TIMEOUT_S) -> str:
    try:
        done = subprocess.run(  # noqa: S603  (argv from the operator's template, no shell)
            argv, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeliveryFailed(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-300:]
        raise DeliveryFailed(f"{argv[0]} exited {done.returncode}: {tail}")
    return done.stdout


def one_line(text: str, limit: int = 200) -> str:
    """Slurm keeps the reason on one line; keep it short and free of control characters."""
    return " ".join(text.split())[:limit]


def fields(line: str) -> dict[str, str]:
    """`scontrol show ... -o` output as a dict; Reason and Comment may hold spaces."""
    marks = list(_KEY.finditer(line))
    out = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


class SlurmActions:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.scontrol = shlex.split(settings.slurm_scontrol)

    def _show(self, kind: str, name: str) -> dict[str, str]:
        return fields(run([*self.scontrol, "show", kind, "-o", name]).strip())

    def flag(self, flag: NodeFlag) -> None:
        reason = one_line(f"{MARK} {flag.reason}")
        node = self._show("node", flag.node)
        if flag.slurm == SlurmMark.DRAIN:
            theirs = "DRAIN" in node.get("State", "") and not _ours(node.get("Reason", ""))
            if not theirs:  # an administrator's drain keeps its reason (and its owner)
                run(render(self.settings.slurm_drain_command, node=flag.node, reason=reason))
            return
        # An administrator's comment stays in front of ours, and comes back on repair.
        kept = _without_ours(node.get("Comment", ""))
        comment = f"{kept}{SEPARATOR}{reason}" if kept else reason
        run([*self.scontrol, "update", f"NodeName={flag.node}", f"Comment={comment}"])

    def clear(self, clear: NodeClear) -> None:
        node = self._show("node", clear.node)
        if "DRAIN" in node.get("State", "") and _ours(node.get("Reason", "")):
            run([*self.scontrol, "update", f"NodeName={clear.node}", "State=RESUME"])
        comment = node.get("Comment", "")
        if _ours(comment) or SEPARATOR + MARK in comment:
            kept = _without_ours(comment)
            run([*self.scontrol, "update", f"NodeName={clear.node}", f"Comment={kept}"])

    def requeue(self, job: Requeue) -> None:
        try:
            state = self._show("job", job.job_id).get("JobState", "")
        except DeliveryFailed as exc:
            if "Invalid job id" not in str(exc):
                raise
            # Not a Slurm job (or long gone): nothing to requeue, and retrying cannot help.
            log.warning("slurm does not know job %s; not requeued", job.job_id)
            return
        # Already back in the queue: a retry after the requeue went through.
        done = state in REQUEUED
        if not job.exclude:
            if not done:
                run(render(self.settings.slurm_requeue_command, job_id=job.job_id))
            return
        # Held while pending, so it cannot start again before the exclusion is set.
        if not done:
            run([*self.scontrol, "requeuehold", job.job_id])
        excluded = self._show("job", job.job_id).get("ExcNodeList", "(null)")
        nodes = [] if excluded == "(null)" else self._hostnames(excluded)
        nodes += [n for n in job.exclude if n not in nodes]
        run([*self.scontrol, "update", f"JobId={job.job_id}", f"ExcNodeList={','.join(nodes)}"])
        if self._show("job", job.job_id).get("Reason") == "JobHeldUser":
            run([*self.scontrol, "release", job.job_id])

    def _hostnames(self, hostlist: str) -> list[str]:
        """`gpu[01-03]` as gpu01, gpu02, gpu03."""
        return run([*self.scontrol, "show", "hostnames", hostlist]).split()


def _ours(text: str) -> bool:
    return text.startswith(MARK)


def _without_ours(comment: str) -> str:
    """An administrator's part of a node comment, without what Railover appended."""
    if _ours(comment) or comment == "(null)":
        return ""
    return comment.split(SEPARATOR + MARK, 1)[0]
