"""Benchmarks that ship with the product (`meteor bench grid|pubsub|spark`).

Each module exposes ``add_arguments(parser)`` and ``run(args) -> dict``, prints a table, and reports its figures
next to a ceiling measured in the same run. Timing lives here, never in pass/fail tests.
"""

from __future__ import annotations

from typing import Any

from meteor_spark.errors import ConfigError


def check_at_least_one(options: Any, names: tuple[str, ...]) -> None:
    """Every ``names`` field of a bench's options is >= 1, else a ConfigError naming the flag and its value."""
    for name in names:
        value = getattr(options, name)
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def given(value: int | None, default: int) -> int:
    """A size flag's value, ``default`` when it was not given; a given 0 stays 0 (``check_at_least_one`` then
    refuses it by name, where ``value or default`` would run the default silently)."""
    return default if value is None else value
