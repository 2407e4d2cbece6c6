"""Every setting of the service and the agent, as `railover config` and the README show them.

Generated from the settings classes, so a field added there is listed everywhere with
no further edit: its variable name, its type with bounds, its default and its
`description`. `python -m scheduler_svc.settings_doc README.md` rewrites the README's
table between its markers; a test fails when the two drift apart.
"""

from __future__ import annotations

import enum
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

BEGIN = "<!-- settings:begin (generated: python -m scheduler_svc.settings_doc README.md) -->"
END = "<!-- settings:end -->"


@dataclass(frozen=True)
class SettingDoc:
    variable: str
    type: str
    default: str
    meaning: str


def settings_classes() -> list[tuple[str, type[BaseSettings]]]:
    # Imported here: the agent's settings pull in its collectors, which `railover config`
    # alone needs.
    from agent.config import AgentSettings  # noqa: PLC0415
    from scheduler_svc.config import Settings  # noqa: PLC0415

    return [("railover serve", Settings), ("railover-agent", AgentSettings)]


def describe(settings_cls: type[BaseSettings]) -> list[SettingDoc]:
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    return [
        SettingDoc(
            variable=prefix + name.upper(),
            type=_type_name(field),
            default=_default(field),
            meaning=field.description or "",
        )
        for name, field in settings_cls.model_fields.items()
    ]


def _type_name(field: FieldInfo) -> str:
    base = _annotation_name(field.annotation)
    bounds = []
    for meta in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(meta, attr, None)
            if isinstance(meta, annotated_types.BaseMetadata) and value is not None:
                bounds.append(f"{sign} {_bound(value, field)}")
    return f"{base} {', '.join(bounds)}" if bounds else base


def _bound(value: object, field: FieldInfo) -> str:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and extra.get("doc_octal") and isinstance(value, int):
        return oct(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _annotation_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is typing.Annotated:
        return _annotation_name(args[0])
    if origin in (typing.Union, types.UnionType):
        names = [_annotation_name(a) for a in args]
        return names[0] if len(names) == 1 else " or ".join(names)
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(annotation))
    if origin in (list, tuple):
        return f"list of {_annotation_name(args[0])}"
    if annotation is SecretStr:
        return "secret"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "doc_default" in extra:
        return str(extra["doc_default"])
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]  # no-argument factories
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return ",".join(_scalar(v) for v in value) if value else "none"
    return _scalar(value)


def _scalar(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def markdown() -> str:
    """The README's table: one per program."""
    out = []
    for program, cls in settings_classes():
        out += [
            f"`{program}`:",
            "",
            "| variable | type | default | meaning |",
            "| --- | --- | --- | --- |",
        ]
        out += [
            f"| `{d.variable}` | {d.type} | `{d.default}` | {d.meaning} |".replace("``", "(empty)")
            for d in describe(cls)
        ]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _cell(text: str) -> str:
    """Table-safe: a pipe would end the cell."""
    return text.replace("|", "\\|") if text else "(empty)"


def splice(readme: str) -> str:
    """The README with its generated section replaced by the current one."""
    head, sep, rest = readme.partition(BEGIN)
    if not sep or END not in rest:
        raise ValueError(f"README has no {BEGIN} ... {END} section")
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{markdown()}{END}{tail}"


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("README.md")
    path.write_text(splice(path.read_text()))
    print(f"wrote the settings table in {path}")


if __name__ == "__main__":
    main()
