"""The package and the tests are ruff-clean (lint and format) and mypy-clean under the settings in pyproject.toml,
so the README's test command checks all three.

Both tools run as subprocesses from the checkout root (they read ``[tool.ruff]`` / ``[tool.mypy]`` there); the
findings are the assertion message, so a failure reads like the tool's own output.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    """The tool installed next to the running interpreter (the test extra), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]' installs it")
    return found


CHECKED = ["meteor_spark", "pyspark_meteor", "tests"]


def test_ruff_finds_nothing() -> None:
    done = subprocess.run(
        [_tool("ruff"), "check", "--no-cache", *CHECKED], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_changes_nothing() -> None:
    done = subprocess.run(
        [_tool("ruff"), "format", "--check", "--no-cache", *CHECKED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, "run `ruff format` over these files:\n" + done.stdout + done.stderr


def test_mypy_finds_nothing() -> None:
    done = subprocess.run(
        [_tool("mypy"), "--no-incremental"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
