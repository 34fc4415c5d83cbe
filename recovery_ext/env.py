"""Settings from environment variables, validated with a clear error that names the variable."""

from __future__ import annotations

import os

from .errors import ConfigurationError


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1h`` or ``1d`` as seconds."""
    raw = str(text).strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    factor = 1
    if raw and raw[-1] in units:
        factor = units[raw[-1]]
        raw = raw[:-1]
    try:
        value = float(raw) * factor
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90, 90s, 10m, 1h)") from None
    if value <= 0:
        raise ValueError(f"a duration must be positive, got {text!r}")
    return value


def env_seconds(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{name}: {exc}") from exc


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
