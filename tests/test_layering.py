"""Dependencies point one way, down the layers of ``LAYERS`` (cli -> console -> bench -> spark -> config/testing ->
consumer -> groups -> producer -> grid -> format -> errors and the other base modules); server/ imports neither
pyspark nor hazelcast. ``meteor_spark.compat`` holds the private couplings to both dependencies and imports each only
inside the function that needs it.

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
    nodes: list[ast.AST] = list(tree.body) if module_level_only else list(ast.walk(tree))
    if module_level_only:  # include imports nested in module-level if/try blocks, not in functions or classes
        pending: list[ast.AST] = list(tree.body)
        nodes = []
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


def test_only_grid_and_compat_import_hazelcast() -> None:
    offenders = [module_name(p) for p in python_files() if "hazelcast" in imported_roots(p, module_level_only=False)]
    # grid/aio_client.py is the asyncio twin of grid/client.py: it couples to ``hazelcast.asyncio`` (the official
    # asyncio client) the way client.py couples to the threaded one, so the asyncio API (meteor_spark.aio) runs on
    # the caller's event loop without a thread of its own.
    # compat_asyncio.py holds the asyncio client's private couplings (compat.py's twins, apart for its size), and
    # compat_ring.py the ring read path's, compat_frames.py the frame reader its answers come through,
    # compat_reactor.py the reactor loop's.
    assert offenders == [
        "meteor_spark.compat",
        "meteor_spark.compat_asyncio",
        "meteor_spark.compat_frames",
        "meteor_spark.compat_reactor",
        "meteor_spark.compat_ring",
        "meteor_spark.grid.aio_client",
        "meteor_spark.grid.client",
    ]
    for compat in ("compat.py", "compat_asyncio.py", "compat_frames.py", "compat_reactor.py", "compat_ring.py"):
        assert "hazelcast" not in imported_roots(PACKAGE / compat, module_level_only=True)  # inside functions only


#: The only packages whose modules may import pyspark when imported: the connector and the benchmarks' Spark side.
PYSPARK_PACKAGES = ("meteor_spark.spark", "meteor_spark.bench.jobs")


def test_only_the_spark_package_imports_pyspark_at_module_level() -> None:
    offenders = [
        module_name(p)
        for p in python_files()
        if "pyspark" in imported_roots(p, module_level_only=True) and not module_name(p).startswith(PYSPARK_PACKAGES)
    ]
    assert offenders == [], f"import pyspark inside the functions that need it, or move the code to {PYSPARK_PACKAGES}"
    assert "pyspark" in imported_roots(PACKAGE / "compat.py", module_level_only=False)  # the runner hook's check


def test_server_package_imports_nothing_outside_itself_but_the_error_tree() -> None:
    for path in python_files():
        name = module_name(path)
        if not name.startswith("meteor_spark.server"):
            continue
        tree = ast.parse(path.read_text())
        allowed = ("meteor_spark.server", "meteor_spark.errors", "meteor_spark.testing", "meteor_spark.allocator")
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
        if not module_name(p).startswith(PYSPARK_PACKAGES) and p.name != "__main__.py"
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
        "import sys, meteor_spark\nprint(sorted(m for m in ('pyspark', 'hazelcast', 'pyarrow') if m in sys.modules))"
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


# ---------------------------------------------------------------------------------------- the project's own layers


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement that can run, with whether it runs at module level; ``if TYPE_CHECKING:`` blocks never
    run and are skipped."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for orelse in child.orelse:
                    visit(orelse, module_level)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, module_level))
            inner = module_level and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, inner)

    visit(tree, True)
    return found


def _modules() -> dict[str, Path]:
    return {module_name(p): p for p in python_files()}


def internal_edges(*, module_level_only: bool = False) -> dict[str, set[str]]:
    """module -> the meteor_spark modules it imports (function-level imports included unless asked otherwise).

    ``from meteor_spark.x import y`` points at ``meteor_spark.x.y`` when that is a module, else at ``meteor_spark.x``;
    relative imports are resolved against the importing module's package.
    """
    modules = _modules()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, module_level in _runtime_imports(ast.parse(path.read_text(), filename=str(path))):
            if module_level_only and not module_level:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parent + ([base] if base else []))
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                ]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


#: The layers, lowest first: a module may import its own layer and the ones below, never one above.
#: ``meteor_spark`` itself (the lazy facade) may import anything; the server stands apart (checked above).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "errors",
            "validate",
            "tables",
            "metrics",
            "compat",
            "compat_asyncio",
            "compat_frames",
            "compat_reactor",
            "compat_ring",
            "compat_otel",
            "_moved",
            "allocator",
        ),
    ),
    ("format", ("format",)),
    ("grid", ("grid",)),
    ("producer", ("producer",)),
    ("groups", ("groups",)),
    ("consumer", ("consumer",)),
    ("aio", ("aio",)),
    ("kit", ("config", "testing")),
    ("spark", ("spark",)),
    ("bench", ("bench",)),
    ("console", ("console",)),
    ("cli", ("cli",)),
)
RANK = {layer: rank for rank, (layer, _) in enumerate(LAYERS)}


def _layer(name: str) -> str:
    """The layer of module ``name``: from its first component under ``meteor_spark``."""
    parts = name.split(".")
    if len(parts) == 1:
        return "facade"
    if parts[1] == "server":
        return "server"
    for layer, tops in LAYERS:
        if parts[1] in tops:
            return layer
    raise AssertionError(f"{name} belongs to no layer: add it to LAYERS in tests/test_layering.py")


def upward_imports(edges: dict[str, set[str]]) -> dict[str, list[str]]:
    """module -> the modules of higher layers it imports (the facade and the server are not ranked)."""
    ranked = {n: RANK.get(_layer(n)) for n in set(edges) | {t for ts in edges.values() for t in ts}}
    return {
        name: sorted(t for t in targets if ranked[t] is not None and ranked[t] > rank)  # type: ignore[operator]
        for name, targets in edges.items()
        if (rank := ranked[name]) is not None and any(ranked[t] is not None and ranked[t] > rank for t in targets)  # type: ignore[operator]
    }


def test_the_edge_finder_sees_function_level_and_relative_imports() -> None:
    edges = internal_edges()
    # cli.bench_cmd imports the bench modules by name at run time (importlib): not an import statement, no edge.
    assert "meteor_spark.bench.jobs.throughput" in edges["meteor_spark.bench.spark"]  # imported inside run()
    assert "meteor_spark.errors" in edges["meteor_spark.grid.client"]
    assert "meteor_spark.tables" in edges["meteor_spark.cli.common"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_among_the_project_modules() -> None:
    """Function-level imports count: a lazy import hides a cycle from the interpreter, not from the design."""
    cycles = _cycles(internal_edges())
    assert cycles == [], f"import cycles (break them by moving the shared part down a layer): {cycles}"


def test_every_module_has_a_layer_and_the_root_stays_small() -> None:
    layers = {name: _layer(name) for name in _modules()}
    assert set(layers.values()) <= {"facade", "server", *RANK}
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    # 15: the base layer's compat modules (compat, compat_asyncio, compat_frames, compat_otel, compat_reactor,
    # compat_ring) are split for size.
    assert len(root) <= 15, f"the package root holds {root}: put modules into the layer packages"


def test_no_layer_imports_a_higher_one() -> None:
    """Function-level imports count too: a lazy import still makes the lower layer depend on the higher one."""
    offenders = upward_imports(internal_edges())
    assert offenders == {}, f"imports that point up the layers (move the shared part down): {offenders}"


def test_the_layer_check_catches_a_wrong_import() -> None:
    edges = {"meteor_spark.format.wire": {"meteor_spark.producer.publisher", "meteor_spark.errors"}}
    assert upward_imports(edges) == {"meteor_spark.format.wire": ["meteor_spark.producer.publisher"]}
