"""Dependencies point one way: spark/ -> core -> grid.py -> hazelcast; server/ imports neither pyspark nor hazelcast.

Checked twice: statically (which files import ``hazelcast`` / ``pyspark`` at module level) and at runtime in a fresh
interpreter (importing a module must not drag in a dependency it should not have, also not indirectly).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import meteor_spark

PACKAGE = Path(meteor_spark.__file__).resolve().parent
ROOT = PACKAGE.parent


def python_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_roots(path: Path, *, module_level_only: bool) -> set[str]:
    """Top-level package names imported by ``path`` (optionally only by statements at module level)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    if module_level_only:  # include imports nested in module-level if/try blocks, not in functions or classes
        pending, nodes = list(tree.body), []
        while pending:
            node = pending.pop()
            nodes.append(node)
            if isinstance(node, (ast.If, ast.Try)):
                pending.extend(ast.iter_child_nodes(node))
    roots: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_only_grid_module_imports_hazelcast() -> None:
    offenders = [
        module_name(p) for p in python_files() if "hazelcast" in imported_roots(p, module_level_only=False)
    ]
    assert offenders == ["meteor_spark.grid"]


def test_only_the_spark_package_imports_pyspark_at_module_level() -> None:
    offenders = [
        module_name(p)
        for p in python_files()
        if "pyspark" in imported_roots(p, module_level_only=True)
        and not module_name(p).startswith("meteor_spark.spark")
    ]
    assert offenders == [], "import pyspark inside the functions that need it, or move the code to meteor_spark.spark"


def test_server_package_imports_nothing_outside_itself_but_the_error_tree() -> None:
    for path in python_files():
        name = module_name(path)
        if not name.startswith("meteor_spark.server"):
            continue
        tree = ast.parse(path.read_text())
        allowed = ("meteor_spark.server", "meteor_spark.errors", "meteor_spark.testing")
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target.startswith("meteor_spark."):
                    assert target.startswith(allowed), (
                        f"{name} imports {target}: the embedded grid must stay independent of the client side"
                    )


_PROBE = r"""
import importlib, json, sys
names = json.loads(sys.argv[1])
results = {}
for name in names:
    importlib.import_module(name)
    results[name] = {"pyspark": "pyspark" in sys.modules}
    if results[name]["pyspark"]:
        break
print(json.dumps(results))
"""


def test_importing_any_module_outside_spark_does_not_load_pyspark() -> None:
    # Module names from the file tree: pkgutil.walk_packages would import meteor_spark.spark itself to walk it.
    names = [
        module_name(p)
        for p in python_files()
        if not module_name(p).startswith("meteor_spark.spark") and not p.name == "__main__.py"
    ]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(names)], capture_output=True, text=True, timeout=120, check=True
    )
    results = json.loads(done.stdout)
    loaded = [name for name, found in results.items() if found["pyspark"]]
    assert loaded == [], f"importing {loaded} loaded pyspark; import it inside the functions that need it"
    assert len(results) == len(names)  # every module was imported


def test_importing_the_server_loads_neither_pyspark_nor_hazelcast() -> None:
    probe = (
        "import sys, pkgutil, importlib, meteor_spark.server as s\n"
        "for i in pkgutil.walk_packages(s.__path__, 'meteor_spark.server.'):\n"
        "    importlib.import_module(i.name)\n"
        "print(sorted(m for m in ('pyspark', 'hazelcast') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_importing_the_package_is_cheap() -> None:
    probe = (
        "import sys, meteor_spark\n"
        "print(sorted(m for m in ('pyspark', 'hazelcast', 'pyarrow') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_without_pyspark_the_core_works_and_spark_entry_points_name_the_extra() -> None:
    """pyspark is the ``spark`` extra: the core must not need it, and every Spark entry point says how to get it."""
    script = """
import contextlib, io, json, sys
sys.modules["pyspark"] = None  # as if pyspark were not installed
import meteor_spark
from meteor_spark import Publisher, StreamConfig, Subscriber
out = {}
for what in ("import meteor_spark.spark", "meteor_spark.register"):
    try:
        exec(what)
        out[what] = "no error"
    except ModuleNotFoundError as exc:
        out[what] = str(exc)
from meteor_spark.cli.main import main
for argv in (["demo"], ["bench", "spark", "--quick"]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    out[" ".join(argv)] = [code, err.getvalue()]
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    results = json.loads(done.stdout.strip().splitlines()[-1])
    hint = "meteor_spark.spark needs pyspark: pip install 'meteor-spark[spark]'"
    assert hint in results["import meteor_spark.spark"]
    assert hint in results["meteor_spark.register"]
    for command in ("demo", "bench spark --quick"):
        code, stderr = results[command]
        assert code == 1 and stderr.strip().splitlines() == [f"meteor {command.split()[0]}: error: {hint}"], stderr
