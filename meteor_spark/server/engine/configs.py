"""Per-name configs matched the way Hazelcast matches them (ring buffer configs, map configs).

A config is named by an exact object name or a pattern with one ``*`` wildcard (``meteor.stream::orders.*``);
``NamedConfigs.find`` picks the config of a name with Hazelcast's ``MatchingPointConfigPatternMatcher`` rules and falls
back to the ``default`` config. Both services share this one implementation so their matching can never diverge.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from meteor_spark.server.errors import InvalidConfiguration

DEFAULT_NAME = "default"


class NamedConfig(Protocol):
    @property
    def name(self) -> str: ...

    def describe(self) -> str:
        """Java-like rendering, used in conflict messages."""


C = TypeVar("C", bound=NamedConfig)


def check_pattern(kind: str, name: str) -> None:
    """Refuse a config name Hazelcast's matcher cannot use.

    Raises:
        InvalidConfiguration: the name is empty or has more than one ``*``.
    """
    if not name:
        raise InvalidConfiguration(f"{kind} config name is empty; give an object name or a pattern such as 'orders.*'")
    if name.count("*") > 1:
        raise InvalidConfiguration(
            f"{kind} config name {name!r} has more than one '*'; Hazelcast patterns allow at most one wildcard"
        )


def match_pattern(patterns: Iterable[str], name: str) -> str | None:
    """Hazelcast's ``MatchingPointConfigPatternMatcher``: an exact name wins; otherwise the pattern with one ``*``
    whose literal prefix + suffix match the most characters.

    Raises:
        InvalidConfiguration: two patterns match equally well (Hazelcast refuses the ambiguity too).
    """
    base = name.split("@", 1)[0]  # "name@partitionKey" uses the config of "name"
    best: str | None = None
    best_points = -1
    duplicate: str | None = None
    for pattern in patterns:
        if pattern == base:
            return pattern
        star = pattern.find("*")
        if star < 0:
            continue
        prefix, suffix = pattern[:star], pattern[star + 1 :]
        if len(base) < len(prefix) + len(suffix) or not base.startswith(prefix) or not base.endswith(suffix):
            continue
        points = len(prefix) + len(suffix)
        if points > best_points:
            best, best_points, duplicate = pattern, points, None
        elif points == best_points:
            duplicate = pattern
    if duplicate is not None:
        raise InvalidConfiguration(
            f"configuration {name!r} has duplicate configuration: patterns {best!r} and {duplicate!r} "
            "match it equally well"
        )
    return best


class NamedConfigs(Generic[C]):
    """A service's configs by name or pattern: static ones from the member's start-up, dynamic ones added by clients.

    Args:
        default: the config of names no pattern matches (replaced by a config named ``"default"``).
        configs: initial configs; a conflicting pair raises like ``add``.
    """

    def __init__(self, default: C, configs: Iterable[C] = ()) -> None:
        self._builtin_default = default
        self.default = default
        self.configs: dict[str, C] = {}
        for config in configs:
            self.add(config)

    def add(self, config: C) -> bool:
        """Add a config; True if it is new, False if the same one exists.

        Raises:
            InvalidConfiguration: a different config with the same name exists.
        """
        if config.name == DEFAULT_NAME:
            if config == self.default:
                return False
            if self.default != self._builtin_default:
                raise _conflict(config, self.default)
            self.default = config
            return True
        existing = self.configs.get(config.name)
        if existing is None:
            self.configs[config.name] = config
            return True
        if existing == config:
            return False
        raise _conflict(config, existing)

    def find(self, name: str) -> C:
        """The config of object ``name``: the best-matching pattern's, else the default.

        Raises:
            InvalidConfiguration: two patterns match ``name`` equally well.
        """
        pattern = match_pattern(self.configs, name)
        return self.default if pattern is None else self.configs[pattern]


def _conflict(new: NamedConfig, existing: NamedConfig) -> InvalidConfiguration:
    # Hazelcast's words (ClusterWideConfigurationService), which clients may match; the fix is the caller's to say.
    return InvalidConfiguration(
        f"Cannot add a dynamic configuration '{new.describe()}' as there is already a conflicting configuration "
        f"'{existing.describe()}'"
    )
