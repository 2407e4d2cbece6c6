"""Reading settings from the environment: the parsing and checks every settings class
shares (the service's, the CLI's refusals), kept apart from the service's Settings."""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import BaseSettings

# Kubernetes gives every pod docker-link variables for each Service in its namespace:
# the Services `railover` and `railover-agent` yield RAILOVER_SERVICE_HOST,
# RAILOVER_PORT=tcp://10.0.0.1:8080, RAILOVER_AGENT_PORT_9465_TCP_ADDR and so on.
# They are not settings, and not misspellings of one.
SERVICE_LINK = re.compile(
    r"^RAILOVER_(?:AGENT_)?(?:SERVICE_HOST|SERVICE_PORT(?:_\w+)?|PORT|PORT_\d+_(?:TCP|UDP|SCTP)\w*)$"
)
SERVICE_LINK_VALUE = re.compile(r"^(?:tcp|udp|sctp)://[^/]+:\d+$")


def is_loopback(host: str) -> bool:
    """True for addresses that only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_store_url(url: str) -> None:
    """Refuse, before anything connects, a store URL that cannot work (no I/O here)."""
    scheme, sep, _ = url.partition("://")
    backend = scheme.split("+", 1)[0].lower()
    if not sep or backend not in ("sqlite", "postgresql", "postgres"):
        raise ValueError(
            "only SQLite (sqlite:///path/railover.db) and PostgreSQL "
            "(postgresql://user@host/db) stores are supported"
        )
    if backend == "sqlite" and sqlite_path(url) is None:
        raise ValueError(
            "an in-memory SQLite store is gone when the command exits (and each command "
            "would get its own); give a file: sqlite:///path/railover.db"
        )


def sqlite_path(url: str) -> Path | None:
    """The file of a sqlite:/// URL; None for an in-memory store."""
    rest = url.partition("://")[2]
    path = (rest[1:] if rest.startswith("/") else rest).split("?", 1)[0]
    return None if not path or path == ":memory:" else Path(path)


def parse_list(value: object) -> object:
    """A list setting from the environment: `1.2,1.5` or JSON `[1.2, 1.5]`."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON list ({exc.msg}); or write it as a,b,c") from exc
    return [part.strip() for part in text.split(",") if part.strip()]


def env_names(settings_cls: type[BaseSettings]) -> list[str]:
    """The variable name of every field of a settings class."""
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    return [prefix + name.upper() for name in settings_cls.model_fields]


def unknown_variables(
    environ: Mapping[str, str],
    settings_cls: type[BaseSettings],
    *,
    ignore_prefixes: Iterable[str] = (),
    ignore_names: Iterable[str] = (),
) -> list[str]:
    """One warning per variable with the class's prefix that names no setting."""
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    known = env_names(settings_cls)
    skip_prefixes = tuple(ignore_prefixes)
    skip_names = set(ignore_names)
    warnings = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(prefix) or upper in known or upper in skip_names:
            continue
        if (skip_prefixes and upper.startswith(skip_prefixes)) or SERVICE_LINK.match(upper):
            continue
        # Matched without the shared prefix, which would make every name look alike.
        near = difflib.get_close_matches(
            upper.removeprefix(prefix), [k.removeprefix(prefix) for k in known], n=1, cutoff=0.7
        )
        hint = (
            f"; did you mean {prefix}{near[0]}?"
            if near
            else "; `railover config` lists every setting"
        )
        warnings.append(f"{name} is not a setting and is ignored{hint}")
    return warnings


def describe_errors(exc: ValidationError, settings_cls: type[BaseSettings]) -> list[str]:
    """One line per invalid setting, naming its variable and the value given."""
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    lines = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        var = prefix + field.upper() if field else "settings"
        given = err.get("input")
        shown = "" if given is None or isinstance(given, dict) else f"={given!s}"
        msg = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"{var}{shown}: {msg}")
    return lines
