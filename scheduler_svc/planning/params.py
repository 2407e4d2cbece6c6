"""Parameters of the planning tools: defaults, YAML files, validation and derived rates.

The defaults are the ReCCL paper's simulation setup (§4.1): a 16,384-GPU
Llama3-405B job of 1925 fault-free hours, monthly failure rates of 0.057 % per
RNIC-ToR link and 0.051 % per ToR switch, hourly checkpoints,
T_detect = T_reload = 0.5 h, 10,000 runs, DP 16 for restart+scaling and node
replacement after 24 h. Every error names the command-line flag it is about,
so a mistake in a YAML study file points at the right key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from scheduler_svc.engine.decision import ib_timeout_s
from scheduler_svc.engine.slowdown import PAPER_DEFAULT_K

# 8760 h / 12: a "monthly" rate is a probability per 730 hours.
HOURS_PER_MONTH = 8760.0 / 12.0
HOURS_PER_YEAR = 8760.0
# NCCL's defaults NCCL_IB_TIMEOUT=20 and NCCL_IB_RETRY_CNT=7: ~34 s before a dead path errors out.
DEFAULT_TIMEOUT_S = ib_timeout_s(20, 7)
# Llama3-405B at 16M tokens per step: 6·405e9·16e6 FLOP / (16,384 GPUs × 400 TFLOP/s) ≈ 6 s.
DEFAULT_ITERATION_S = 6.0
CHECKPOINT_MODES = ("interval", "flowcheck")


class ParamError(ValueError):
    """A parameter is invalid; `key` is the underscored name, `flag` the option."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.flag = flag_of(key)
        self.message = message
        super().__init__(f"{self.flag}: {message}")


def flag_of(key: str) -> str:
    """The command-line flag for a parameter key (`gpus_per_node` → `--gpus-per-node`)."""
    return "--" + key.replace("_", "-")


@dataclass(frozen=True, slots=True)
class JobModel:
    """One training job and its fault environment, in the units the flags use."""

    gpus: int = 16384
    gpus_per_node: int = 8
    hours: float = 1925.0
    link_failure_monthly: float = 0.00057
    switch_failure_monthly: float = 0.00051
    switches: int | None = None
    nodes_per_switch: int = 32
    checkpoint: str = "interval"
    checkpoint_interval_h: float = 1.0
    iteration_s: float = DEFAULT_ITERATION_S
    detect_h: float = 0.5
    reload_h: float = 0.5
    timeout_s: float = DEFAULT_TIMEOUT_S
    k: tuple[float, ...] = PAPER_DEFAULT_K
    dp: int = 16
    node_replace_h: float = 24.0
    repair_h: float = 24.0

    def __post_init__(self) -> None:
        _positive_int(self, "gpus", "gpus_per_node", "nodes_per_switch", "dp")
        _positive_float(self, "hours", "checkpoint_interval_h", "iteration_s")
        _non_negative_float(self, "detect_h", "reload_h", "timeout_s", "node_replace_h", "repair_h")
        for key in ("link_failure_monthly", "switch_failure_monthly"):
            value = getattr(self, key)
            if not (0.0 <= value < 1.0):
                raise ParamError(key, f"must be a fraction in [0, 1), got {value}")
        if self.gpus % self.gpus_per_node:
            raise ParamError(
                "gpus",
                f"{self.gpus} GPUs is not a multiple of --gpus-per-node {self.gpus_per_node}",
            )
        if self.switches is not None and self.switches < 0:
            raise ParamError("switches", f"must be >= 0, got {self.switches}")
        if self.checkpoint not in CHECKPOINT_MODES:
            raise ParamError(
                "checkpoint", f"must be one of {', '.join(CHECKPOINT_MODES)}, got {self.checkpoint}"
            )
        if not self.k:
            raise ParamError("k", "needs at least one slowdown factor")
        for value in self.k:
            if not (math.isfinite(value) and value >= 1.0):
                raise ParamError("k", f"every slowdown factor must be >= 1, got {value}")
        if self.dp < 2:
            raise ParamError("dp", f"restart+scaling needs a DP size of at least 2, got {self.dp}")

    def check_replicas(self) -> None:
        """Restart+scaling drops whole DP replicas, so the nodes must split evenly into them."""
        if self.nodes % self.dp:
            raise ParamError(
                "dp", f"{self.nodes} nodes do not split into {self.dp} data-parallel replicas"
            )

    # Derived quantities, in hours.
    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def links(self) -> int:
        """RNIC-to-ToR links: one RNIC per GPU, as in the paper's rail-optimised cluster."""
        return self.gpus

    @property
    def switch_count(self) -> int:
        """`--switches`, or one ToR per rail per group of `--nodes-per-switch` nodes."""
        if self.switches is not None:
            return self.switches
        return self.gpus_per_node * math.ceil(self.nodes / self.nodes_per_switch)

    @property
    def link_rate_per_h(self) -> float:
        return hourly_hazard(self.link_failure_monthly)

    @property
    def switch_rate_per_h(self) -> float:
        return hourly_hazard(self.switch_failure_monthly)

    @property
    def fault_rate_per_h(self) -> float:
        """Faults per wall-clock hour that touch the job (links plus switches)."""
        return self.links * self.link_rate_per_h + self.switch_count * self.switch_rate_per_h

    @property
    def interval_h(self) -> float:
        """Progress between usable checkpoints: one iteration under FlowCheck."""
        if self.checkpoint == "flowcheck":
            return self.iteration_s / 3600.0
        return self.checkpoint_interval_h

    @property
    def timeout_h(self) -> float:
        return self.timeout_s / 3600.0

    def describe(self) -> dict[str, Any]:
        """The parameters used plus the derived counts and rates, for every output."""
        out = asdict(self)
        out["k"] = list(self.k)
        out["derived"] = {
            "nodes": self.nodes,
            "links": self.links,
            "switches": self.switch_count,
            "faults_per_hour": self.fault_rate_per_h,
            "expected_faults": self.fault_rate_per_h * self.hours,
            "effective_checkpoint_interval_h": self.interval_h,
        }
        return out


@dataclass(frozen=True, slots=True)
class RunOptions:
    runs: int = 10000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ParamError("runs", f"must be >= 1, got {self.runs}")
        if self.seed < 0:
            raise ParamError("seed", f"must be >= 0, got {self.seed}")


@dataclass(frozen=True, slots=True)
class MirrorParams:
    """FlowCheck capture planning for one DP ring."""

    loss: float = 1e-6
    dp: int = 16
    packets: int = 100000
    target: float = 1.0
    iteration_s: float = DEFAULT_ITERATION_S
    rails: int = 8
    ranks_per_switch: int = 4

    def __post_init__(self) -> None:
        if not (0.0 <= self.loss < 1.0 and math.isfinite(self.loss)):
            raise ParamError("loss", f"must be a probability in [0, 1), got {self.loss}")
        _positive_int(self, "dp", "packets", "rails", "ranks_per_switch")
        if self.dp < 2:
            raise ParamError("dp", f"a DP ring needs at least 2 ranks, got {self.dp}")
        _positive_float(self, "iteration_s")
        if not (self.target >= 0 and math.isfinite(self.target)):
            raise ParamError("target", f"must be a finite number >= 0, got {self.target}")

    @property
    def iterations_per_year(self) -> float:
        return HOURS_PER_YEAR * 3600.0 / self.iteration_s


def hourly_hazard(monthly_fraction: float) -> float:
    """Per-hour hazard whose Bernoulli-per-hour survival over a month is 1 − monthly_fraction."""
    return -math.log1p(-monthly_fraction) / HOURS_PER_MONTH


def _positive_int(obj: object, *keys: str) -> None:
    for key in keys:
        value = getattr(obj, key)
        if not (isinstance(value, int) and value >= 1):
            raise ParamError(key, f"must be a whole number >= 1, got {value}")


def _positive_float(obj: object, *keys: str) -> None:
    for key in keys:
        value = getattr(obj, key)
        if not (math.isfinite(value) and value > 0):
            raise ParamError(key, f"must be a finite number > 0, got {value}")


def _non_negative_float(obj: object, *keys: str) -> None:
    for key in keys:
        value = getattr(obj, key)
        if not (math.isfinite(value) and value >= 0):
            raise ParamError(key, f"must be a finite number >= 0, got {value}")


# --- reading values from flags and YAML ---------------------------------------------


def parse_float_list(key: str, raw: object) -> tuple[float, ...]:
    """A comma list ("1.03,1.2") or a YAML list of numbers."""
    items: list[object]
    if isinstance(raw, str):
        items = [part.strip() for part in raw.split(",") if part.strip()]
    elif isinstance(raw, list | tuple):
        items = list(raw)
    elif isinstance(raw, int | float) and not isinstance(raw, bool):
        items = [raw]
    else:
        raise ParamError(key, f"expected a comma list of numbers, got {raw!r}")
    try:
        return tuple(float(str(item)) for item in items)
    except ValueError as exc:
        raise ParamError(key, f"expected a comma list of numbers, got {raw!r}") from exc


def parse_int_list(key: str, raw: object) -> tuple[int, ...]:
    values = parse_float_list(key, raw)
    if not values:
        raise ParamError(key, "needs at least one value")
    for value in values:
        if value != int(value):
            raise ParamError(key, f"expected whole numbers, got {value}")
    return tuple(int(value) for value in values)


def _as_int(key: str, raw: object) -> int:
    if isinstance(raw, bool):
        raise ParamError(key, f"expected a whole number, got {raw!r}")
    if isinstance(raw, int):
        return raw
    try:
        as_float = float(str(raw))
    except ValueError as exc:
        raise ParamError(key, f"expected a whole number, got {raw!r}") from exc
    if as_float != int(as_float):
        raise ParamError(key, f"expected a whole number, got {raw!r}")
    return int(as_float)


def _as_float(key: str, raw: object) -> float:
    if isinstance(raw, bool):
        raise ParamError(key, f"expected a number, got {raw!r}")
    try:
        return float(str(raw))
    except ValueError as exc:
        raise ParamError(key, f"expected a number, got {raw!r}") from exc


def _as_str(key: str, raw: object) -> str:
    if not isinstance(raw, str):
        raise ParamError(key, f"expected text, got {raw!r}")
    return raw


Converter = Callable[[str, object], object]


def _converters(cls: type) -> dict[str, Converter]:
    out: dict[str, Converter] = {}
    for f in fields(cls):
        kind = str(f.type)
        if "tuple[float" in kind:
            out[f.name] = parse_float_list
        elif kind.startswith("int"):
            out[f.name] = _as_int
        elif kind.startswith("float"):
            out[f.name] = _as_float
        else:
            out[f.name] = _as_str
    return out


_JOB_CONVERTERS = _converters(JobModel)
_RUN_CONVERTERS = _converters(RunOptions)
_MIRROR_CONVERTERS = _converters(MirrorParams)


def load_config(path: Path | None) -> dict[str, object]:
    """Read a YAML mapping of parameter keys (underscored, like the flags) to values."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ParamError("config", f"cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ParamError("config", f"{path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ParamError("config", f"{path} must hold a mapping of parameter names to values")
    return {str(key): value for key, value in data.items()}


def merge(
    allowed: Mapping[str, Converter],
    config: Mapping[str, object],
    flags: Mapping[str, object | None],
) -> dict[str, object]:
    """Config-file values overridden by the flags that were given; unknown keys are errors."""
    for key in config:
        if key.replace("-", "_") not in allowed:
            raise ParamError("config", f"unknown key {key!r} (known: {', '.join(sorted(allowed))})")
    merged: dict[str, object] = {}
    for key, value in config.items():
        name = key.replace("-", "_")
        if value is not None:
            merged[name] = allowed[name](name, value)
    for name, value in flags.items():
        if value is not None:
            merged[name] = allowed[name](name, value)
    return merged


def _build_job(values: Mapping[str, object]) -> JobModel:
    kwargs = {key: value for key, value in values.items() if key in _JOB_CONVERTERS}
    return JobModel(**kwargs)  # type: ignore[arg-type]  # converted per field by _converters


def _build_run(values: Mapping[str, object]) -> RunOptions:
    kwargs = {key: value for key, value in values.items() if key in _RUN_CONVERTERS}
    return RunOptions(**kwargs)  # type: ignore[arg-type]  # converted per field by _converters


def simulate_params(
    config: Path | None,
    flags: Mapping[str, object | None],
    base: Mapping[str, object] | None = None,
) -> tuple[JobModel, RunOptions]:
    """The job model and run options for `railover simulate`; `base` (values fitted from
    a history) replaces the defaults, and the config file and flags win over it."""
    allowed = {**_JOB_CONVERTERS, **_RUN_CONVERTERS}
    values = {**(base or {}), **merge(allowed, load_config(config), flags)}
    job = _build_job(values)
    job.check_replicas()
    return job, _build_run(values)


def analytic_params(
    config: Path | None, flags: Mapping[str, object | None]
) -> tuple[list[JobModel], int, int]:
    """One job model per GPU count in `--gpus`, plus runs and seed of the optional cross-check.

    `--runs` defaults to 0 here: the analytic model needs no sampling, and a
    positive value adds a Monte Carlo check of the same expectation.
    """
    allowed: dict[str, Converter] = {**_JOB_CONVERTERS, **_RUN_CONVERTERS}
    allowed["gpus"] = parse_int_list
    values = merge(allowed, load_config(config), flags)
    gpu_counts = values.pop("gpus", (1024, 4096, 16384, 65536))
    assert isinstance(gpu_counts, tuple)
    runs = values.pop("runs", 0)
    seed = values.pop("seed", 0)
    assert isinstance(runs, int)
    assert isinstance(seed, int)
    if runs < 0:
        raise ParamError("runs", f"must be >= 0, got {runs}")
    if seed < 0:
        raise ParamError("seed", f"must be >= 0, got {seed}")
    jobs = [_build_job({**values, "gpus": count}) for count in gpu_counts]
    return jobs, runs, seed


def mirror_params(config: Path | None, flags: Mapping[str, object | None]) -> MirrorParams:
    """The capture-planning parameters for `railover mirror-plan`."""
    values = merge(_MIRROR_CONVERTERS, load_config(config), flags)
    return MirrorParams(**values)  # type: ignore[arg-type]  # converted per field by _converters
