"""The allocator settings for large records (``meteor_spark.allocator``): applied once on glibc, so a fresh process
reuses freed buffers instead of faulting new pages in for each; skipped with the opt-out, when the environment sets
malloc itself, and off glibc."""

from __future__ import annotations

import subprocess
import sys

import pytest

from meteor_spark import allocator

#: A fresh interpreter allocating a 4 MiB buffer (a few calls' worth of 10 KiB records), with or without the
#: settings: glibc's counters (mallinfo2) say whether it was given its own mapping (hblks) and, once freed, whether
#: the heap kept the memory for the next one (fordblks: free bytes kept in the heap).
_PROBE = """
import ctypes, sys
from meteor_spark.allocator import tune_allocator
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
outcome = tune_allocator() if sys.argv[1] == "tuned" else None
before = libc.mallinfo2().hblks
buffer = bytearray(4 << 20)
mapped = libc.mallinfo2().hblks - before
del buffer
print(mapped, libc.mallinfo2().fordblks >= 4 << 20, outcome.applied if outcome else None)
"""


def _probe(mode: str, env: dict[str, str]) -> list[str]:
    return subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=60, env=env, check=True
    ).stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_a_tuned_process_keeps_large_buffers_in_its_heap() -> None:
    env = {"PATH": "/usr/bin:/bin"}
    # By default a 4 MiB buffer gets a mapping of its own, unmapped when freed (faulted in again next time).
    assert _probe("default", env) == ["1", "False", "None"]
    assert _probe("tuned", env) == ["0", "True", "True"]
    assert _probe("tuned", {**env, allocator.OPT_OUT_ENV: "off"}) == ["1", "False", "False"]


def test_the_opt_out_and_the_environment_win(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*allocator._ENV_SETTINGS, "GLIBC_TUNABLES", allocator.OPT_OUT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(allocator.OPT_OUT_ENV, "off")
    assert allocator.skip_reason() == f"{allocator.OPT_OUT_ENV}=off"
    monkeypatch.delenv(allocator.OPT_OUT_ENV)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.top_pad=1048576")
    assert allocator.skip_reason() == "set in the environment (GLIBC_TUNABLES)"
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("MALLOC_TOP_PAD_", "1048576")
    assert allocator.skip_reason() == "set in the environment (MALLOC_TOP_PAD_)"


def test_nothing_is_done_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*allocator._ENV_SETTINGS, "GLIBC_TUNABLES", allocator.OPT_OUT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert allocator.skip_reason() == "not glibc (darwin)"
    assert allocator._apply(allocator.TOP_PAD_BYTES) == allocator.AllocatorTuning(False, "not glibc (darwin)")
