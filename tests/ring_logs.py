"""Damaging an embedded member's ring logs the way a machine crash does, for the truncated-lane fault tests."""

from __future__ import annotations

from pathlib import Path


def cut_records(log: Path, count: int) -> None:
    """Cut the last ``count`` whole records off a ring log (each: length u32, crc u32, then ``length`` bytes): the
    torn tail a crash under ``fsync=interval`` or ``never`` leaves, which the member's restart then truncates."""
    data = log.read_bytes()
    starts, at = [], 0
    while at < len(data):
        starts.append(at)
        at += 8 + int.from_bytes(data[at : at + 4], "little")
    assert at == len(data) and len(starts) >= count
    log.write_bytes(data[: starts[-count]])
