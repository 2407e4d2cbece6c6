"""The field types every request and response shares, and the strict base of requests.

Bounded numbers and ids (each fits its store column and stays exact in any JSON
parser), names, times, durations and URLs; `Strict` refuses unknown fields,
non-finite numbers and text the store cannot keep.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    HttpUrl,
    UrlConstraints,
    field_validator,
)


def whole_number(value: Any) -> Any:
    # JSON Schema's integers include 5.0; booleans and numeric text are not numbers here.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Every integer fits the store's signed 64-bit columns (comm ids, unsigned 64-bit on
# the wire, are mapped onto them by store.types.UInt64). Counts and ids stop at 2^53 - 1,
# the largest integer every JSON parser (and a float-typed JSON Schema bound) keeps exact.
INT64_MAX = 2**63 - 1
JSON_INT_MAX = 2**53 - 1
Count = Annotated[int, Field(strict=True, ge=0, le=JSON_INT_MAX), BeforeValidator(whole_number)]
# Path ids arrive as text: parsed, so not strict.
Id64 = Annotated[int, Field(ge=1, le=JSON_INT_MAX)]
# Ids of rows keyed by a 32-bit INTEGER (faults, flags, maintenance windows): a larger one
# names nothing, and PostgreSQL would refuse to compare it.
RowId = Annotated[int, Field(ge=1, le=2**31 - 1)]
RANK_MAX = 131071
RAIL_MAX = 1023
RankNo = Annotated[int, Field(strict=True, ge=0, le=RANK_MAX), BeforeValidator(whole_number)]
GpuNo = Annotated[int, Field(strict=True, ge=0, le=1023), BeforeValidator(whole_number)]
Numa = Annotated[int, Field(strict=True, ge=-1, le=1023), BeforeValidator(whole_number)]
Scale = Annotated[int, Field(strict=True, ge=1, le=2**20), BeforeValidator(whole_number)]
# A job's incarnation: 1 when first posted, one more at each restart the service decided.
Incarnation = Annotated[int, Field(strict=True, ge=1, le=2**31 - 1), BeforeValidator(whole_number)]
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
JobId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][\w.:-]*$")]
# An RDMA device as the kernel names it (mlx5_0, rocep1s0f0, irdma1): no slashes, no dots first.
DeviceName = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
]
# A PCIe switch, root complex, fabric switch, netdev or state label.
Label = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
]
# domain:bus:device.function; Linux prints the domain as %04x, so VMD and Hyper-V's 32-bit
# domains come with 5 to 8 digits (10000:e1:00.0).
PciAddress = Annotated[
    str,
    Field(
        min_length=12,
        max_length=16,
        pattern=r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-1][0-9a-fA-F]\.[0-7]$",
    ),
]
Text = Annotated[str, Field(max_length=2000)]


def _fits_column(url: HttpUrl) -> HttpUrl:
    # Normalising (a trailing slash, punycode) can lengthen what was sent.
    if len(str(url)) > 2048:
        raise ValueError("URL longer than 2048 characters once normalised")
    return url


# Webhook targets: at most 2000 characters as sent, 2048 as stored.
WebUrl = Annotated[HttpUrl, UrlConstraints(max_length=2000), AfterValidator(_fits_column)]

# Durations: finite, and bounded where a bigger value can only be a typo.
DAY_S = 86400.0
Seconds = Annotated[float, Field(strict=True, ge=0, le=DAY_S)]
Interval = Annotated[float, Field(strict=True, gt=0, le=7 * DAY_S)]
LongSeconds = Annotated[float, Field(strict=True, gt=0, le=365 * DAY_S)]
Slowdown = Annotated[float, Field(strict=True, ge=1, le=100)]
Share = Annotated[float, Field(strict=True, ge=0, le=1)]


# Times the service can store and compute with: an instant on the UTC calendar, with room
# left for the arithmetic done on it (a checkpoint plus a year's interval). Outside it a
# conversion to UTC overflows (0001-01-01T00:00:00+14:00 is in year 0): refused as 422,
# never a 500 that an agent would retry.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def _utc(value: datetime) -> datetime:
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            f"{value.isoformat()} is not a representable UTC instant (its offset moves it "
            "outside years 1-9999)"
        ) from None
    if not EARLIEST <= utc < LATEST:
        raise ValueError(
            f"{utc.isoformat()} is outside the times the service keeps "
            f"({EARLIEST.isoformat()} to {LATEST.isoformat()})"
        )
    return utc


_RFC3339_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ]")


def _text_time(value: Any) -> Any:
    # A bare number, or a number in a string (a query parameter is always one), would pass
    # as a Unix time; the API takes RFC 3339 text only.
    if not isinstance(value, datetime) and not (
        isinstance(value, str) and _RFC3339_DATE.match(value)
    ):
        raise ValueError("give an RFC 3339 time with its offset, e.g. 2026-11-01T12:00:00Z")
    return value


UtcTime = Annotated[AwareDatetime, BeforeValidator(_text_time), AfterValidator(_utc)]


# Lone UTF-16 surrogates cannot be stored as UTF-8, and PostgreSQL refuses NUL.
_UNSAFE_TEXT = re.compile("[\x00\ud800-\udfff]")
_CONTAINERS = (str, dict, list, tuple)


def _is_text_safe(value: str) -> bool:
    return _UNSAFE_TEXT.search(value) is None


def _check_text(value: Any) -> None:
    if isinstance(value, str):
        if not _is_text_safe(value):
            raise ValueError("text must be valid Unicode without NUL or lone surrogates")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k)
            _check_text(v)
    elif isinstance(value, (list, tuple)):
        # Only what can hold text is looked into: a job's 65,536 ranks are models, each
        # checked by its own fields' validators already.
        for v in value:
            if isinstance(v, _CONTAINERS):
                _check_text(v)


class Strict(BaseModel):
    """Unknown fields are refused so a typo never silently means "use the default";
    numbers are finite (JSON's Infinity and NaN are refused) and text is storable.
    Numbers, booleans and times are strict (false is not 0, 1 is not a time)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _storable_text(cls, value: Any) -> Any:
        return storable_text(value)


def storable_text(value: Any) -> Any:
    """`value`, once any text in it is found storable (ValueError otherwise)."""
    _check_text(value)
    return value
