"""Service settings: one class, environment prefix RAILOVER_."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DB_URL = "sqlite:///railover.db"


def is_loopback(host: str) -> bool:
    """True for addresses that only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """Everything `railover serve` can be told; see README for each variable."""

    model_config = SettingsConfigDict(env_prefix="RAILOVER_", extra="ignore")

    db_url: str = Field(default=DEFAULT_DB_URL, description="SQLAlchemy URL of the store")
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    # With no token in the store, a service bound to loopback answers without
    # authentication so a first `railover serve` is usable on a laptop. It never
    # does so on a routable address (`serve` refuses to start there).
    allow_anonymous_loopback: bool = True
    # Tie-break cap for s-Bond: GPUs that may back up onto RNICs behind one PCIe
    # switch. None spreads them evenly over the switches that hold fabric RNICs.
    backup_cap_per_switch: Annotated[int | None, Field(ge=1)] = None
    default_k: tuple[float, ...] = (1.03, 1.20, 1.50)
    commands_wait_max_s: Annotated[float, Field(gt=0, le=120)] = 30.0
    max_events_per_request: Annotated[int, Field(ge=1)] = 1000
    log_level: str = "INFO"

    @field_validator("default_k")
    @classmethod
    def _k_at_least_one(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or any(k < 1.0 for k in value):
            raise ValueError("default_k needs at least one entry, each >= 1")
        return value

    @property
    def sqlalchemy_url(self) -> str:
        """The URL with the psycopg 3 driver chosen for plain postgresql:// URLs."""
        url = self.db_url
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        return url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
