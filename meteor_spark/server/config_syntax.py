"""The command-line form of the per-name configs a member starts with: ``--ring-config`` / ``--map-config``
``PATTERN:setting=N[,setting=N]``, parsed and formatted from one declaration per kind (``RING_CONFIG_SYNTAX``,
``MAP_CONFIG_SYNTAX``), so ``python -m meteor_spark.server`` reads exactly what ``EmbeddedGrid(process=True)`` writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from meteor_spark.errors import ConfigError, unknown_option
from meteor_spark.server.engine.map_types import MapConfig
from meteor_spark.server.engine.ringbuffer import RingConfig

ConfigT = TypeVar("ConfigT", RingConfig, MapConfig)


@dataclass(frozen=True)
class ConfigSyntax(Generic[ConfigT]):
    """The command-line form ``PATTERN:setting=N[,setting=N]`` of a per-name config (ring buffers, maps).

    ``settings`` maps each command-line setting to the config's field; every setting is an integer.
    """

    kind: str
    config_type: type[ConfigT]
    settings: dict[str, str]

    @property
    def usage(self) -> str:
        return "PATTERN:" + ",".join(f"{setting}=N" for setting in self.settings)

    def parse(self, text: str) -> ConfigT:
        """Parse one config.

        Raises:
            ValueError: naming the part that is wrong and showing the expected form.
        """
        name, sep, rest = text.rpartition(":")
        if not sep or not name:
            raise ConfigError(f"{self.kind} {text!r}: expected {self.usage} (settings optional)")
        values: dict[str, Any] = {}
        for part in filter(None, rest.split(",")):
            key, eq, value = part.partition("=")
            if not eq or key not in self.settings:
                error = unknown_option(f"{self.kind} setting", key, self.settings)
                raise ConfigError(f"{self.kind} {text!r}: {error}")
            try:
                values[self.settings[key]] = int(value)
            except ValueError:
                raise ConfigError(f"{self.kind} {text!r}: {key} must be an integer, got {value!r}") from None
        return self.config_type(name=name, **values)

    def format(self, config: ConfigT) -> str:
        values = ",".join(f"{setting}={int(getattr(config, name))}" for setting, name in self.settings.items())
        return f"{config.name}:{values}"


RING_CONFIG_SYNTAX = ConfigSyntax(
    "ring config",
    RingConfig,
    {"capacity": "capacity", "ttl": "ttl_s", "backups": "backup_count", "async-backups": "async_backup_count"},
)
MAP_CONFIG_SYNTAX = ConfigSyntax(
    "map config",
    MapConfig,
    {"ttl": "time_to_live_seconds", "max-idle": "max_idle_seconds", "per-entry-stats": "per_entry_stats_enabled"},
)


def parse_ring_config(text: str) -> RingConfig:
    """``PATTERN:capacity=N[,ttl=S][,backups=B][,async-backups=A]`` (see ``ConfigSyntax.parse``)."""
    return RING_CONFIG_SYNTAX.parse(text)


def parse_map_config(text: str) -> MapConfig:
    """``PATTERN:ttl=S[,max-idle=S]`` (see ``ConfigSyntax.parse``)."""
    return MAP_CONFIG_SYNTAX.parse(text)
