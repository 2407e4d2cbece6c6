"""GPU-hours lost over simulated time per policy (`railover twin --plot`), as PNG, SVG or
PDF; matplotlib is imported only when a figure is drawn, in the style of
`railover simulate --plot` (planning.plot).

`LossCurve` samples a running twin: after each of its steps, the GPU-hours its jobs have
lost so far (elapsed minus progress, as the books count the total), read from a copy of
each job so that sampling never changes the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from scheduler_svc.planning.plot import FORMATS
from scheduler_svc.twin.books import Curve
from scheduler_svc.twin.loop import Twin

SAMPLES = 1000  # at most this many points per run, evenly spread in simulated time


class LossCurve:
    """Call it as the twin's progress callback (with `then` for a progress bar)."""

    def __init__(self, twin: Twin, then: Callable[[float], None] | None = None) -> None:
        self.twin = twin
        self.then = then
        self.horizon = twin.days * 86400.0
        self.days: list[float] = [0.0]
        self.lost: list[float] = [0.0]

    def __call__(self, done: float) -> None:
        t = done * self.horizon
        if t - self.days[-1] * 86400.0 >= self.horizon / SAMPLES:
            self.days.append(t / 86400.0)
            self.lost.append(self.lost_at(t))
        if self.then is not None:
            self.then(done)

    def lost_at(self, t: float) -> float:
        total = 0.0
        for job in self.twin.jobs.values():
            shadow = dataclasses.replace(job, lost=dict(job.lost), on_backup=set())
            shadow.accrue(t)
            total += (t - shadow.progress) * job.spec.gpus
        return total / 3600.0

    def finish(self, gpu_hours_total: float) -> None:
        """The books' total at the horizon closes the curve."""
        self.days.append(self.horizon / 86400.0)
        self.lost.append(gpu_hours_total)


def plot_loss(curves: Mapping[str, Sequence[Curve]], path: Path, title: str) -> None:
    """Write the figure to `path` in the format its suffix names (one of FORMATS)."""
    import matplotlib  # noqa: PLC0415  # lazy: only --plot needs it

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt  # noqa: PLC0415

    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise ValueError(f"{path}: the suffix must name one of {FORMATS}")
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for policy, runs in curves.items():
        end = max(c.days[-1] for c in runs)
        grid = np.linspace(0.0, end, 400)
        per_seed = np.array([np.interp(grid, c.days, c.lost) for c in runs])
        (line,) = ax.plot(grid, per_seed.mean(axis=0), linewidth=1.6, label=policy)
        if len(runs) > 1:  # each seed faintly under the mean
            for row in per_seed:
                ax.plot(grid, row, linewidth=0.6, alpha=0.3, color=line.get_color())
    ax.set_xlabel("Simulated time (days)")
    ax.set_ylabel("GPU-hours lost (cumulative)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(title="policy", loc="upper left")
    fig.tight_layout()
    fig.savefig(path, format=suffix)
    plt.close(fig)


def title_of(nodes: int, days: float, fault_scale: float, seeds: int, extra: str = "") -> str:
    scale = f", faults ×{fault_scale:g}" if fault_scale != 1 else ""
    mean = f", mean of {seeds} seeds" if seeds > 1 else ""
    return f"{nodes:,} nodes ({8 * nodes:,} GPUs), {days:g} days{scale}{mean}{extra}"
