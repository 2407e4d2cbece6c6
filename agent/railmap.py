"""The rail map: which fabric switch and rail each RNIC port is cabled to.

sysfs cannot know the cabling, so it comes from a file (JSON or YAML) mapping
``"mlx5_0/1"`` to ``{"switch": "rail0-a", "rail": 0}``. Ports not in the map
(storage NICs) are reported with switch and rail null and carry no GPU traffic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

KEY_HELP = 'keys look like "mlx5_0/1" (device/port)'


class RailAssignment(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    switch: str = Field(min_length=1, max_length=253)
    rail: int = Field(ge=0, le=4096)


RailMap = dict[tuple[str, int], RailAssignment]


class RailMapError(ValueError):
    pass


def parse_rail_map(data: Any, source: str = "rail map") -> RailMap:
    if not isinstance(data, dict):
        raise RailMapError(f"{source}: top level must be a mapping; {KEY_HELP}")
    out: RailMap = {}
    for key, value in data.items():
        dev, sep, port = str(key).partition("/")
        if not sep or not dev or not port.isdigit():
            raise RailMapError(f"{source}: bad key {key!r}; {KEY_HELP}")
        try:
            out[(dev, int(port))] = RailAssignment.model_validate(value)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
            )
            raise RailMapError(f"{source}: entry {key!r}: {problems}") from exc
    return out


def load_rail_map(path: Path | None) -> RailMap:
    if path is None:
        return {}
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise RailMapError(f"{path}: not valid {path.suffix.lstrip('.') or 'YAML'}: {exc}") from exc
    return parse_rail_map(data or {}, str(path))
