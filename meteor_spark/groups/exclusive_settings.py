"""An exclusive group's stored settings: ``dead_letter_after`` and the dead-letter stream it sends to.

They belong to the group, not to a member, like a shared group's (``meteor_spark.groups.shared_state.GroupSettings``):
the member that takes a lane over after another died must dead-letter by the same distance. They live in the map
``meteor.group.offsets`` under key ``["<stream>","<group>","@settings"]`` (shaped like a lane key, so the tools
that forget a stream's groups remove it too; ``list_groups`` counts no offset for it)::

    {"dead_letter_after":100,"dead_letter_stream":"orders-dlq","v":1}

Only a group given ``dead_letter_after`` has the entry: the first member that gives it stores it
(``put_if_absent``), later members use it and a member that asks for another value is refused with a
``ConfigError`` naming both. A member that gives none reads the entry once when it is created (one map read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meteor_spark.errors import ConfigError
from meteor_spark.grid.client import GridMap
from meteor_spark.groups.leases import canonical, decode_entry
from meteor_spark.groups.redelivery import check_dead_letter_after
from meteor_spark.groups.store import GROUP_FORMAT, OFFSETS_MAP

__all__ = [
    "ExclusiveSettings",
    "agreed_settings",
    "exclusive_settings",
    "exclusive_settings_key",
    "wanted_settings",
]


def exclusive_settings_key(stream: str, group: str) -> str:
    """Key of an exclusive group's settings in ``meteor.group.offsets``."""
    return canonical([stream, group, "@settings"])


@dataclass(frozen=True)
class ExclusiveSettings:
    """An exclusive group's settings (see the module docs)."""

    dead_letter_after: int
    dead_letter_stream: str

    def encode(self) -> str:
        return canonical(
            {
                "v": GROUP_FORMAT,
                "dead_letter_after": self.dead_letter_after,
                "dead_letter_stream": self.dead_letter_stream,
            }
        )

    @classmethod
    def decode(cls, text: str, where: str) -> ExclusiveSettings:
        return decode_entry(text, f"group settings {where}", "group settings", "group", GROUP_FORMAT, cls._build)

    @classmethod
    def _build(cls, raw: dict[str, Any]) -> ExclusiveSettings:
        return cls(int(raw["dead_letter_after"]), str(raw["dead_letter_stream"]))


def exclusive_settings(
    offsets: GridMap, stream: str, group: str, dead_letter_after: int | None, dead_letter_stream: str | None
) -> ExclusiveSettings | None:
    """The group's settings: stored by this member when it gives ``dead_letter_after`` and the group has none, read
    otherwise (None: the group has none). ``dead_letter_stream`` is the member's own (also its ``on_corrupt``
    stream); when it gives ``dead_letter_after`` it must give one.

    Raises:
        ConfigError: ``dead_letter_after`` invalid or without a dead-letter stream, the dead-letter stream is the
            stream read, or the group stores other values than this member gives.
    """
    wanted = wanted_settings(dead_letter_after, dead_letter_stream)
    key = exclusive_settings_key(stream, group)
    text = offsets.get(key)
    if text is None and wanted is not None:
        text = offsets.put_if_absent(key, wanted.encode())
    return agreed_settings(text, wanted, stream, group)


def wanted_settings(dead_letter_after: int | None, dead_letter_stream: str | None) -> ExclusiveSettings | None:
    """The settings a member gives, checked (None: it gives none)."""
    check_dead_letter_after(dead_letter_after, dead_letter_stream)
    if dead_letter_after is None:
        return None
    assert dead_letter_stream is not None
    return ExclusiveSettings(dead_letter_after, dead_letter_stream)


def agreed_settings(
    text: str | None, wanted: ExclusiveSettings | None, stream: str, group: str
) -> ExclusiveSettings | None:
    """The group's settings from the stored ``text`` (None: nothing stored, so ``wanted`` was just stored, or the
    group has none), refused when this member ``wanted`` others (the threaded and asyncio members' one rule)."""
    if text is None:
        return wanted
    key = exclusive_settings_key(stream, group)
    stored = ExclusiveSettings.decode(text, f"{key} in map {OFFSETS_MAP!r}")
    if wanted is not None and wanted != stored:
        raise ConfigError(
            f"group {group!r} of stream {stream!r} has dead_letter_after={stored.dead_letter_after} with "
            f"dead_letter_stream={stored.dead_letter_stream!r}, but this member asks for "
            f"dead_letter_after={wanted.dead_letter_after} with dead_letter_stream={wanted.dead_letter_stream!r}. "
            f"They are group settings, stored by the member that gave them first: leave dead_letter_after out to "
            f"use the group's, or forget the group's state (meteor_spark.groups.admin.forget_groups(grid, "
            f"{stream!r}, {group!r})) to start it again with new ones"
        )
    if stored.dead_letter_stream == stream:
        raise ConfigError(
            f"dead_letter_stream={stream!r} is the stream being read: dead letters would be read again; name "
            f"another stream"
        )
    return stored
