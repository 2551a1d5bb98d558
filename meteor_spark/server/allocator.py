"""The member process's memory allocator: keep freed memory for the next ring items instead of returning it at once.

glibc's malloc serves blocks above its mmap threshold (128 KiB, raised as such blocks are freed) with fresh
mappings and gives the top of its heap back to the kernel as soon as a little of it is free. A member storing and
dropping MiB-sized frames and ring items then page-faults (and has the kernel zero) every new one: copying a 1 MiB
item ran at ~0.5 GB/s instead of tens of GB/s. Padding the heap's top (``M_TOP_PAD``) keeps up to that much freed
memory mapped for reuse; the member's resident size may stay that much above what it holds.

Applied by ``python -m meteor_spark.server`` / ``meteor grid start`` (a process that is only a member), never to a
member running in a thread of someone else's process. Only glibc has this knob (Linux); elsewhere nothing is done.
The environment wins: with ``MALLOC_TOP_PAD_`` or a ``glibc.malloc`` tunable set, the process is left as configured.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

logger = logging.getLogger(__name__)

M_TOP_PAD = -2  # glibc's mallopt parameter number

#: Freed heap memory kept mapped for reuse.
DEFAULT_TOP_PAD_BYTES = 64 * 1024 * 1024


def keep_freed_memory(pad_bytes: int = DEFAULT_TOP_PAD_BYTES) -> bool:
    """Set glibc's ``M_TOP_PAD`` to ``pad_bytes`` for this process; whether it was set."""
    if not sys.platform.startswith("linux"):
        return False
    if "MALLOC_TOP_PAD_" in os.environ or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (or no symbol table to search)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(M_TOP_PAD, pad_bytes))
    logger.debug("malloc top pad %d bytes: %s", pad_bytes, "set" if done else "refused")
    return done
