"""Which lane a key goes to: part of the stored format, so every process, platform and version agrees.

``lane_for_key`` is CRC-32 (zlib / IEEE 802.3) of the key bytes modulo the lane count. Changing it would split a
key's records over two lanes, so it never changes. Pure: no grid, no stream metadata; the publisher, the Arrow
input and the readers all call this one function.
"""

from __future__ import annotations

import zlib


def lane_for_key(key: bytes, lanes: int) -> int:
    """The lane of a key: CRC-32 (zlib) of the key bytes modulo ``lanes`` (stable everywhere, forever)."""
    return zlib.crc32(key) % lanes
