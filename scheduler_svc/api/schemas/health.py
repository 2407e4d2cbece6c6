"""The health probe's answer (/healthz, /readyz)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    detail: dict[str, Any] = Field(default_factory=dict)
