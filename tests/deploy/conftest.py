"""The deployment tier: meteor-spark as a user installs and runs it, outside the checkout.

``deploy_python`` is a fresh virtualenv holding only the wheel built from this checkout with its ``spark`` and
``connect`` extras (pip resolves them as for any user; its cache keeps repeated runs fast). Every Spark process of
this tier (drivers, a standalone cluster's executors, a Spark Connect server's Python workers) runs that Python, from
a directory outside the checkout, so nothing of the source tree can leak in.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _source_files() -> list[str]:
    """Files of the checkout a build may see: tracked plus new, not ignored (never .venv, build/, caches)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def _pip(args: list[str], cwd: Path) -> None:
    """Run pip quietly; its whole output only when it fails."""
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built from a copy of its files (the checkout stays untouched)."""
    source = tmp_path_factory.mktemp("source")
    for name in _source_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    out = tmp_path_factory.mktemp("dist")
    _pip([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(source)], out)
    (built,) = out.glob("meteor_spark-*.whl")
    return built


@pytest.fixture(scope="session")
def deploy_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv with ``meteor-spark[spark,connect]`` installed from the wheel: its ``python``."""
    home = tmp_path_factory.mktemp("deploy-venv")
    venv.EnvBuilder(with_pip=True).create(home)
    python = home / "bin" / "python"
    _pip([str(python), "-m", "pip", "install", "--quiet", f"{wheel}[spark,connect]"], home)
    yield python


@pytest.fixture(scope="session")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory outside the checkout."""
    return tmp_path_factory.mktemp("outside")
