"""The ring items' checksum: zlib's CRC-32, computed by the fastest implementation installed.

Every publisher checksums every item it writes and every reader every item it decodes, so the CRC is paid on each
byte twice. CPython's ``zlib.crc32`` runs the system zlib's table-driven loop (0.33 ms per MiB here, about as much
as the rest of a 10 KiB record's decoding); ISA-L's (the ``isal`` package, a dependency) uses carry-less multiply
instructions: 0.044 ms per MiB, the same polynomial, the same values for the same bytes and seed. Without ``isal``
(a platform it has no wheel for) ``zlib.crc32`` is used: only slower. ``IMPLEMENTATION`` names the one in use.
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol


class _Crc32(Protocol):
    def __call__(self, data: Any, value: int = 0, /) -> int: ...


crc32: _Crc32

try:
    from isal.isal_zlib import crc32 as _isal_crc32
except ImportError:  # pragma: no cover - isal is a dependency; a platform without its wheel falls back
    crc32 = zlib.crc32
    IMPLEMENTATION = "zlib"
else:
    crc32 = _isal_crc32
    IMPLEMENTATION = "isal"

__all__ = ["IMPLEMENTATION", "crc32"]
