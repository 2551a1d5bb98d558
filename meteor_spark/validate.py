"""Checked conversions for settings and arguments, so every module words the same mistake the same way.

A bool is an ``int`` to Python but never a sensible count, size or lane, so it is rejected explicitly.
"""

from __future__ import annotations

from meteor_spark.errors import ConfigError

__all__ = ["check_int", "check_number"]


def check_int(name: str, value: object, low: int, high: int, *, what: str = "") -> int:
    """Return ``value`` if it is an ``int`` (not a bool) in ``[low, high]``, else raise :class:`ConfigError`.

    ``what`` is appended to the message to say how to fix it (e.g. "(the stream has 8 lanes)").
    """
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        suffix = f" {what}" if what else ""
        raise ConfigError(f"{name} must be an integer in [{low}, {high}], got {value!r}{suffix}")
    return value


def check_number(name: str, value: object, low: float, high: float, *, what: str = "") -> float:
    """Like :func:`check_int` for a real number (int or float, not a bool, not NaN); returns it as given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        suffix = f" {what}" if what else ""
        raise ConfigError(f"{name} must be a number in [{low}, {high}], got {value!r}{suffix}")
    return value
