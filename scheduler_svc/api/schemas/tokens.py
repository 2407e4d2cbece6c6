"""The roles an API token grants."""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    AGENT = "agent"
    FLEET = "fleet"
    VIEWER = "viewer"
