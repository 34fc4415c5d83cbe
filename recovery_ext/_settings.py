"""Settings from environment variables and code, validated with a clear error that names the setting.

Every duration passes :func:`check_seconds`: NaN, infinities, booleans and values outside
sane bounds are refused (an interval below 0.1 s would hammer the database; a timeout
above a day hides crashes for a day, so it needs ``allow_long=True``).
"""

from __future__ import annotations

import decimal
import math
import numbers
import os
import re
from typing import overload

from recovery_ext._errors import ConfigurationError

MIN_INTERVAL = 0.1
DAY = 86400.0
# The longest duration even ``allow_long`` accepts: a century. A time that far ahead is still a date on
# both databases (SQLite's times are read back as Python datetimes, which end at year 9999, while
# PostgreSQL's timestamptz goes on to year 294276), so both agree on every stored deadline.
LONGEST = 100 * 366 * DAY


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1h`` or ``1d`` as seconds; a finite positive number."""
    raw = str(text).strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    factor = 1
    if raw and raw[-1] in units:
        factor = units[raw[-1]]
        raw = raw[:-1]
    try:
        if not raw.isascii():  # float() also reads other scripts' digits ("９０"): an operator typed no such thing
            raise ValueError(raw)
        value = float(raw) * factor
    except (ValueError, OverflowError):
        raise ValueError(f"not a duration: {text!r} (use e.g. 90, 90s, 10m, 1h)") from None
    if not math.isfinite(value):
        raise ValueError(f"a duration must be a finite number, got {text!r}")
    if value <= 0:
        raise ValueError(f"a duration must be positive, got {text!r}")
    return value


def check_seconds(name: str, value: object, *, minimum: float = MIN_INTERVAL, maximum: float = DAY,
                  allow_none: bool = False, allow_long: bool | None = None) -> float | None:
    """``value`` as seconds within ``[minimum, maximum]`` (up to a century with ``allow_long``), or raise naming
    ``name``. ``allow_long`` None: ``maximum`` is the setting's own limit, which nothing lifts; False: the
    error says that ``allow_long_durations`` lifts it."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{name} must be a number of seconds, got {value!r}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond any float
        raise ConfigurationError(f"{name} must be a finite number of seconds, got {value!r:.40}") from None
    if not math.isfinite(value):
        raise ConfigurationError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < minimum:
        raise ConfigurationError(f"{name} must be at least {minimum:g} s, got {value:g}")
    if value > maximum and not allow_long:
        lifted = "" if allow_long is None else " (set allow_long_durations to go beyond)"
        raise ConfigurationError(f"{name} must be at most {maximum:g} s{lifted}, got {value:g}")
    if value > max(maximum, LONGEST):
        raise ConfigurationError(f"{name} must be at most {LONGEST:g} s (a century), got {value:g}")
    return value


def check_age(name: str, value: object) -> float:
    """A retention age as seconds, from 0 (never a future cut-off) to a century. Any real number is one: a
    ``Decimal``, a ``Fraction`` or a numpy value as well as an int or a float (the store's prune calls took them
    before their ages were checked). Settings stay ints and floats: their values reach timers and SQL as given."""
    if not isinstance(value, bool) and isinstance(value, (numbers.Real, decimal.Decimal)):
        try:
            value = float(value)
        except (OverflowError, ValueError):  # an int beyond any float; a signaling NaN
            raise ConfigurationError(f"{name} must be a finite number of seconds, got {value!r:.40}") from None
    checked = check_seconds(name, value, minimum=0.0, maximum=LONGEST)
    assert checked is not None  # allow_none is off: None was refused
    return checked


def check_count(name: str, value: object, *, minimum: int = 0, maximum: int = 1_000_000) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ConfigurationError(f"{name} must be a whole number from {minimum} to {maximum}, got {value!r}")
    return value


@overload
def env_seconds(name: str, default: float, *, minimum: float = ..., maximum: float = ...,
                allow_long: bool | None = ...) -> float: ...
@overload
def env_seconds(name: str, default: None, *, minimum: float = ..., maximum: float = ...,
                allow_long: bool | None = ...) -> float | None: ...
def env_seconds(name: str, default: float | None, *, minimum: float = MIN_INTERVAL, maximum: float = DAY,
                allow_long: bool | None = None) -> float | None:
    """The duration in ``$name`` (see :func:`parse_duration`), checked; ``default`` when it is unset or empty."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = parse_duration(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{name}: {exc}") from None
    return check_seconds(name, value, minimum=minimum, maximum=maximum, allow_long=allow_long)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{name} must be true or false, got {raw!r}")


# A deployment names a Dagster instance in every pipeline row, tick and listing: a short plain name.
_DEPLOYMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_deployment(name: str, value: object) -> str:
    """``value`` as a deployment name (1 to 64 of letters, digits, ``.``, ``_``, ``-``; a letter or digit first)."""
    if not isinstance(value, str) or not _DEPLOYMENT.fullmatch(value):
        long_text = isinstance(value, str) and len(value) > 80
        shown = f"{value[:60]!r}... ({len(value)} chars)" if isinstance(value, str) and long_text else repr(value)
        raise ConfigurationError(f"{name} must be 1 to 64 letters, digits, '.', '_' or '-' starting with a letter "
                                 f"or digit, got {shown}")
    return value

