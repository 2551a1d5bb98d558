"""The process's memory allocator, set for large records: freed buffers are reused instead of being unmapped and
faulted in again. The one coupling to glibc (``mallopt`` through ctypes), used by the clients and the member.

glibc's malloc serves blocks above its mmap threshold (128 KiB at start, raised only as such blocks are freed)
with fresh mappings, and gives the top of its heap back to the kernel as soon as 128 KiB of it is free. A fresh
process publishing or reading 10 KiB records allocates and drops ~1 MiB call buffers and ring items at a high
rate: every one was mapped, page-faulted (and zeroed by the kernel) and unmapped again, 42-82k minor faults per
205 MB, and the fresh process ran at half a warm one's speed (10 KiB ``publish_many``: 307-511 MB/s, 914-953 with
the thresholds raised through ``GLIBC_TUNABLES``). So, once per process, when a client connects or a member
starts:

* ``M_MMAP_THRESHOLD`` = 32 MiB (glibc's ceiling): call buffers and ring items come from the heap;
* ``M_TRIM_THRESHOLD`` = 128 MiB and ``M_TOP_PAD`` = 64 MiB: freed heap memory stays mapped for the next ones.

The price: the process's resident size may stay up to ~128 MiB above what it holds after a burst (per malloc
arena). A member does not call ``malloc_trim`` when a ring is destroyed: measured on rounds of (write 100 MB of
10 KiB records, read them, delete the stream), the member's resident size stays flat at ~125 MB once destroyed
rings let go of their items; trimming after every round brought it to 28 MB between rounds but cost 5-9 ms a trim
and ~24,800 minor faults a round (member CPU 35 -> 80 ms a round), the faults these settings exist to avoid.
Only glibc has these knobs (Linux; not musl, not macOS): elsewhere nothing is done. The environment wins:
with ``METEOR_MALLOC_TUNING=off`` (opt-out), or any ``MALLOC_*_`` variable or ``glibc.malloc`` tunable set, the
process is left as configured.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from dataclasses import dataclass

logger = logging.getLogger(__name__)

#: Set to ``off`` (or ``0``, ``false``, ``no``) to leave the allocator alone.
OPT_OUT_ENV = "METEOR_MALLOC_TUNING"

# glibc's mallopt parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024
TOP_PAD_BYTES = 64 * 1024 * 1024
_ENV_SETTINGS = ("MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_")


@dataclass(frozen=True)
class AllocatorTuning:
    """What ``tune_allocator`` did: ``applied`` the settings, or why not (``reason``)."""

    applied: bool
    reason: str
    settings: tuple[tuple[str, int], ...] = ()


_lock = threading.Lock()
_done: AllocatorTuning | None = None


def tune_allocator(*, top_pad_bytes: int = TOP_PAD_BYTES) -> AllocatorTuning:
    """Apply the settings to this process, once (later calls return the first call's outcome)."""
    global _done
    with _lock:
        if _done is None:
            _done = _apply(top_pad_bytes)
            logger.debug("malloc tuning: %s (%s)", "applied" if _done.applied else "skipped", _done.reason)
        return _done


def skip_reason() -> str | None:
    """Why the settings are not for this process (not glibc, opted out, set in the environment), or None."""
    choice = os.environ.get(OPT_OUT_ENV, "").strip().lower()
    if choice in ("off", "0", "false", "no"):
        return f"{OPT_OUT_ENV}={os.environ[OPT_OUT_ENV]}"
    if choice not in ("", "on", "1", "true", "yes"):
        logger.warning(
            "%s=%r is neither on nor off; tuning the allocator (set it to off to opt out)", OPT_OUT_ENV, choice
        )
    given = [name for name in _ENV_SETTINGS if name in os.environ]
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        given.append("GLIBC_TUNABLES")
    if given:
        return f"set in the environment ({', '.join(given)})"
    if not sys.platform.startswith("linux"):
        return f"not glibc ({sys.platform})"
    return None


def _apply(top_pad_bytes: int) -> AllocatorTuning:
    reason = skip_reason()
    if reason is not None:
        return AllocatorTuning(False, reason)
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it: musl's mallopt does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return AllocatorTuning(False, "not glibc (no gnu_get_libc_version)")
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    wanted = (
        ("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        ("M_TOP_PAD", M_TOP_PAD, top_pad_bytes),
    )
    refused = [name for name, number, value in wanted if not mallopt(number, value)]
    if refused:
        return AllocatorTuning(False, f"glibc refused {', '.join(refused)}")
    return AllocatorTuning(True, "glibc", tuple((name, value) for name, _, value in wanted))
