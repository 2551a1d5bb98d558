"""Checked conversions for settings and arguments, so every module words the same mistake the same way.

A bool is an ``int`` to Python but never a sensible count, size or lane, so it is rejected explicitly.
"""

from __future__ import annotations

from meteor_spark.errors import ArgumentTypeError, ConfigError

__all__ = ["MAX_TIMEOUT_MS", "check_int", "check_number", "check_text", "check_timeout"]

#: The longest wait an argument may ask for: 2**31 - 1 ms (24.8 days), Java's bound for the grid's own timeouts. A
#: longer one (or ``float("inf")``) would overflow the waits underneath rather than mean "for ever".
MAX_TIMEOUT_MS = (1 << 31) - 1


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


def check_text(name: str, value: object, *, empty: bool = False, what: str = "") -> str:
    """Return ``value`` if it is a ``str`` that UTF-8 can encode (no lone surrogates such as ``"a\\udcff"``, which the
    grid cannot store as a name) and, unless ``empty``, not empty; else raise :class:`ConfigError`."""
    suffix = f" {what}" if what else ""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a str, got {type(value).__name__} {value!r}{suffix}")
    if not value and not empty:
        raise ConfigError(f"{name} must not be empty{suffix}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{name} {value!r} is not valid UTF-8 text (a lone surrogate at position {exc.start}); names are stored "
            f"as UTF-8{suffix}"
        ) from None
    return value


def check_timeout(name: str, value: object, *, unit: str = "ms", none: bool = False) -> float | None:
    """A wait given to a call: a finite number >= 0 of ``unit`` (``"ms"`` or ``"s"``) up to ``MAX_TIMEOUT_MS``;
    None passes when ``none`` (wait without a bound)."""
    if value is None and none:
        return None
    high = MAX_TIMEOUT_MS if unit == "ms" else MAX_TIMEOUT_MS / 1000
    what = f"({unit}{'; None waits without a bound' if none else ''})"
    return check_number(name, value, 0, high, what=what)
