"""The CDF of GPU-hours per policy as PNG, SVG or PDF; matplotlib is imported only when asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from scheduler_svc.planning.simulate import SimulationResult

LABELS = {
    "fault_free": "fault-free",
    "restart": "restart",
    "restart_scaling": "restart + scaling",
    "failover": "failover (ReCCL rule)",
    "railover": "Railover",
}
# Failover and Railover coincide when repairs are slow: a wide solid line under a dashed
# one keeps both visible.
# The formats `--plot` writes, named by the file's suffix.
FORMATS = ("png", "svg", "pdf")
STYLES: dict[str, dict[str, object]] = {
    "failover": {"linewidth": 3.2, "alpha": 0.7},
    "railover": {"linewidth": 1.6, "linestyle": "--"},
}


def plot_cdf(result: SimulationResult, path: Path) -> None:
    """Write the CDF figure to `path` in the format its suffix names (one of FORMATS)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  # lazy, see cdf_figure

    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise ValueError(f"{path}: the suffix must name one of {FORMATS}")
    fig = cdf_figure(result)
    fig.savefig(path, format=suffix)
    plt.close(fig)


def cdf_figure(result: SimulationResult) -> Any:
    """One step line per policy: the fraction of runs finishing within x million GPU-hours."""
    # Imported here so the other commands never pay for (or need) matplotlib.
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt  # noqa: PLC0415

    model = result.model
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for policy, wall in result.wall_hours.items():
        gpu_hours = np.sort(wall * model.gpus) / 1e6
        fraction = np.arange(1, gpu_hours.size + 1) / gpu_hours.size
        # Start each line at 0 so a policy with no spread (fault-free) still shows as a step.
        xs = np.concatenate([[gpu_hours[0]], gpu_hours])
        ys = np.concatenate([[0.0], fraction])
        style: dict[str, object] = {"linewidth": 1.6, **STYLES.get(policy, {})}
        ax.step(xs, ys, where="post", label=LABELS.get(policy, policy), **style)  # type: ignore[arg-type]  # matplotlib kwargs
    ax.set_xlabel("GPU-hours used by the job (million GPU·h)")
    ax.set_ylabel("Fraction of runs (cumulative, 0–1)")
    checkpoint = (
        f"per-iteration checkpoints ({model.iteration_s:g} s)"
        if model.checkpoint == "flowcheck"
        else f"checkpoint every {model.checkpoint_interval_h:g} h"
    )
    ax.set_title(
        f"{model.gpus:,} GPUs, {model.hours:g} fault-free h, {checkpoint}, {result.runs:,} runs",
        fontsize=10,
    )
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(title="policy", loc="lower right")
    fig.tight_layout()
    return fig
