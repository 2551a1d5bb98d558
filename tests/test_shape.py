"""Modules and functions stay a size a reader takes in at once.

A module over ``MAX_MODULE_LINES`` is either a declarative table (listed in ``TABLES`` with what it declares) or
split; a function whose body (docstring left out) is over ``MAX_FUNCTION_LINES`` says why next to it, in a comment
starting with ``# long:`` on the line above its ``def`` (or its decorators) or first in its body.
"""

from __future__ import annotations

import ast
from pathlib import Path

import meteor_spark

PACKAGE = Path(meteor_spark.__file__).resolve().parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60

#: Modules that are long because they declare data, not logic: path (from the package) -> what they declare.
TABLES: dict[str, str] = {}


def _files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    if not body:
        return 0
    return (body[-1].end_lineno or body[-1].lineno) - body[0].lineno + 1


def _says_why(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A ``# long:`` comment in the comment block just above the ``def`` (or its decorators), or anywhere before the
    first statement after the docstring."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    above = first - 2
    while above >= 0 and lines[above].strip().startswith("#"):
        if lines[above].strip().startswith("# long:"):
            return True
        above -= 1
    body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    stop = body[0].lineno if body else node.lineno
    return any(line.strip().startswith("# long:") for line in lines[first - 1 : stop - 1])


def long_functions() -> list[str]:
    found = []
    for path in _files():
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = _body_lines(node)
                if size > MAX_FUNCTION_LINES and not _says_why(lines, node):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({size} lines)")
    return found


def test_no_module_is_longer_than_a_reader_takes_in() -> None:
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in _files()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES and str(path.relative_to(PACKAGE)) not in TABLES
    }
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: split them by concern (or list a table in TABLES)"


def test_every_long_function_says_why() -> None:
    found = long_functions()
    assert found == [], (
        f"functions over {MAX_FUNCTION_LINES} lines: split them into named steps, or write `# long: <why>` above: "
        + "; ".join(found)
    )
