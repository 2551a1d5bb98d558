"""The member process's allocator setting: applied on glibc, and the environment wins."""

from __future__ import annotations

import sys

import pytest

from meteor_spark.server import allocator


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_the_top_pad_is_set_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_TOP_PAD_", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert allocator.keep_freed_memory(128 * 1024) is True  # glibc's own default: this test process is unchanged


@pytest.mark.parametrize(
    ("name", "value"), [("MALLOC_TOP_PAD_", "1048576"), ("GLIBC_TUNABLES", "glibc.malloc.top_pad=1048576")]
)
def test_a_setting_in_the_environment_is_left_alone(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    assert allocator.keep_freed_memory() is False


def test_nothing_is_done_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert allocator.keep_freed_memory() is False
