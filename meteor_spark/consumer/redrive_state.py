"""What a redrive of a dead-letter stream keeps in the grid so that running it again delivers nothing twice.

One entry per dead-letter stream in the map ``meteor.dlq.redrive`` (key: the dead-letter stream's name), canonical
JSON so every change is a compare-and-set on exact bytes::

    {"done": {"0": [[65536, 65541], [131072, 131072]]},
     "run": {"owner": "host-4711-1a2b", "host": "host", "pid": 4711,
             "letters": ["0:65542", "0:65543"], "tails": {"orders": {"0": 17, "1": 9}}},
     "v": 1}

- ``done``: per lane of the dead-letter stream, inclusive ranges ``[first, last]`` of dead-letter offsets already
  redriven. A range covers consecutive dead letters as the stream holds them (offsets jump between ring items, so
  a range is "these letters and every letter between them", judged against a scan of the lane). Only letters the
  lane still holds are kept: the entry is bounded by the dead-letter stream's capacity.
- ``run``: the step in progress: the letters being published and, before the first of them was sent, the end
  (``tail + 1``) of every lane of their source streams. Written before publishing and cleared (the letters moved to
  ``done``) once the grid acknowledged them. A run left behind (its process died) is settled by the next redrive:
  it reads the source lanes from those ends and marks done every letter whose record is there (each redriven record
  carries the message id ``dlq:<stream>:<lane>:<offset>``), so only letters that never arrived are sent again.

Pure: encoding, decoding and the range arithmetic; the grid work is in ``meteor_spark.consumer.redrive``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from meteor_spark.groups.leases import canonical, decode_entry

#: The map of redrive progress (one entry per dead-letter stream).
REDRIVE_MAP = "meteor.dlq.redrive"
REDRIVE_FORMAT = 1


def message_id_of(position: str) -> str:
    """The message id of the record redriven from the dead letter at ``position`` (``<stream>:<lane>:<offset>``)."""
    return f"dlq:{position}"


@dataclass(frozen=True)
class RedriveRun:
    """A redrive step in progress (see the module docs)."""

    owner: str
    host: str
    pid: int
    letters: tuple[tuple[int, int], ...]
    tails: Mapping[str, Mapping[int, int]]

    def encode(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "letters": [f"{lane}:{offset}" for lane, offset in self.letters],
            "tails": {s: {str(lane): seq for lane, seq in t.items()} for s, t in self.tails.items()},
        }

    @classmethod
    def decode(cls, raw: dict[str, Any]) -> RedriveRun:
        letters = []
        for text in raw["letters"]:
            lane, offset = str(text).split(":")
            letters.append((int(lane), int(offset)))
        tails = {str(s): {int(lane): int(seq) for lane, seq in t.items()} for s, t in raw["tails"].items()}
        return cls(str(raw["owner"]), str(raw["host"]), int(raw["pid"]), tuple(letters), tails)


@dataclass(frozen=True)
class RedriveProgress:
    """The stored progress of one dead-letter stream's redrives."""

    done: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    run: RedriveRun | None = None

    def encode(self) -> str:
        raw: dict[str, Any] = {
            "v": REDRIVE_FORMAT,
            "done": {str(lane): [list(r) for r in ranges] for lane, ranges in sorted(self.done.items()) if ranges},
        }
        if self.run is not None:
            raw["run"] = self.run.encode()
        return canonical(raw)

    @classmethod
    def decode(cls, text: str | None, where: str) -> RedriveProgress:
        if text is None:
            return cls()
        return decode_entry(
            text, f"redrive progress {where}", "redrive progress", "redrive", REDRIVE_FORMAT, cls._build
        )

    @classmethod
    def _build(cls, raw: dict[str, Any]) -> RedriveProgress:
        done = {int(lane): tuple((int(a), int(b)) for a, b in ranges) for lane, ranges in raw["done"].items()}
        run = raw.get("run")
        return cls(done, None if run is None else RedriveRun.decode(run))

    def is_done(self, lane: int, offset: int) -> bool:
        ranges = self.done.get(lane, ())
        at = bisect_right(ranges, (offset, 1 << 62)) - 1
        return at >= 0 and ranges[at][0] <= offset <= ranges[at][1]

    def with_run(self, run: RedriveRun | None) -> RedriveProgress:
        return replace(self, run=run)

    def marked(self, letters: Iterable[tuple[int, int]], held: Mapping[int, Sequence[int]]) -> RedriveProgress:
        """This progress with ``letters`` done; ``held``: per lane, every dead-letter offset the lane holds, in
        order (ranges are rebuilt over it, so letters no longer held drop out)."""
        new: dict[int, set[int]] = {}
        for lane, offset in letters:
            new.setdefault(lane, set()).add(offset)
        done = dict(self.done)
        for lane in set(new) | set(done):
            offsets = held.get(lane)
            if offsets is None:
                continue  # a lane not scanned keeps what it had
            fresh = new.get(lane, set())
            done[lane] = runs_of(offsets, [o in fresh or self.is_done(lane, o) for o in offsets])
        return replace(self, done=done)


def runs_of(offsets: Sequence[int], covered: Sequence[bool]) -> tuple[tuple[int, int], ...]:
    """The inclusive ranges ``[first, last]`` of consecutive ``offsets`` (in order) whose ``covered`` is true."""
    out: list[tuple[int, int]] = []
    first: int | None = None
    last = 0
    for offset, is_covered in zip(offsets, covered, strict=True):
        if is_covered:
            if first is None:
                first = offset
            last = offset
        elif first is not None:
            out.append((first, last))
            first = None
    if first is not None:
        out.append((first, last))
    return tuple(out)
